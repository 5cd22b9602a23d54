"""imgfilter's CPU backend next to the OpenCV one-liner, same process, same thread count.

For each case (blur, filter2d with random and rank-1 Gaussian kernels, contour; a
2495x2167 RGB uint8 photo-sized image, 8000x8000 gray uint8, a few float32/uint16)
it times `imgfilter.blur/filter2d/contour(..., backend="cpu")` and the cv2 call that
defines its semantics (cv2.blur, cv2.filter2D, cvtColor + 4 filter2D + bitwise_or),
warm, median of --reps runs, the two alternating in one loop (so that load from other
processes hits both alike), with cv2.setNumThreads(n) and numba.set_num_threads(n).
Prints a table (ms, ratio ours / cv2, max |ours - cv2|) and writes JSON with --json.

    PYTHONPATH=$PWD python benchmarks/cpu_bench.py --json out.json [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import numpy as np


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def gaussian(k: int) -> np.ndarray:
    sigma = 0.3 * ((k - 1) * 0.5 - 1) + 0.8  # OpenCV's default sigma for a k-tap Gaussian
    g = np.exp(-0.5 * ((np.arange(k) - (k - 1) / 2) / sigma) ** 2)
    g /= g.sum()
    return np.outer(g, g).astype(np.float32)


def random_kernel(k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, k))
    w /= np.abs(w).sum()
    return (w if w.sum() > 0 else -w).astype(np.float32)


def image(shape, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.float32:
        return (rng.standard_normal(shape) * 100).astype(np.float32)
    return rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)


def cases(quick: bool):
    """(name, image spec, op, arg): op in blur/filter/contour."""
    rgb = ("2495x2167x3 u8", (2167, 2495, 3), np.uint8)
    big = ("8000x8000 u8", (8000, 8000), np.uint8)
    rgbf = ("2495x2167x3 f32", (2167, 2495, 3), np.float32)
    g16 = ("2495x2167 u16", (2167, 2495), np.uint16)
    out = []
    for k in (3, 5, 21, 61):
        out.append((rgb, "blur", k))
    for k in (3, 7, 13, 21, 31, 41):
        out.append((rgb, "filter", ("random", k)))
    for k in (7, 21, 31):
        out.append((rgb, "filter", ("gauss", k)))
    out.append((rgb, "contour", None))
    out.append((rgbf, "blur", 21))
    out.append((rgbf, "filter", ("random", 7)))
    out.append((rgbf, "filter", ("random", 21)))
    out.append((rgbf, "filter", ("random", 31)))
    out.append((rgbf, "filter", ("gauss", 21)))
    out.append((g16, "blur", 21))
    out.append((g16, "filter", ("random", 9)))
    out.append((g16, "filter", ("random", 21)))
    out.append((big, "blur", 21))
    out.append((big, "blur", 61))
    out.append((big, "filter", ("gauss", 31)))
    out.append((big, "contour", None))
    if not quick:
        out.append((big, "filter", ("random", 31)))
    return out


def paired_ms(ours, theirs, reps: int) -> tuple[float, float]:
    """(ours, theirs): median wall ms of `reps` warm runs each, alternating."""
    ours(), theirs()  # warm (compiles, caches)
    times: tuple[list, list] = ([], [])
    for _ in range(reps):
        for fn, acc in ((ours, times[0]), (theirs, times[1])):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[0]), 1e3 * statistics.median(times[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--reps", type=int, default=5, help="timed runs per case (median)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both")
    parser.add_argument("--quick", action="store_true", help="skip the slowest case")
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    args = parser.parse_args(argv)

    import cv2
    import numba

    import imgfilter
    from imgfilter.backends import cpu
    from imgfilter.backends import opencv as ref

    cv2.setNumThreads(args.threads)
    numba.set_num_threads(args.threads)
    header = (
        f"{datetime.date.today()} {platform.node()}: nproc {os.cpu_count()}, {cpu_model()}; "
        f"threads cv2 {cv2.getNumThreads()} / numba {numba.get_num_threads()}; "
        f"opencv {cv2.__version__}, numba {numba.__version__}, numpy {np.__version__}, "
        f"python {platform.python_version()}; median of {args.reps} warm runs; "
        f"load average at start {os.getloadavg()[0]:.1f}"
    )
    print(header)
    print(f"{'case':<44} {'imgfilter ms':>12} {'cv2 ms':>9} {'ratio':>6} {'max|diff|':>10} path")
    rows = []
    for seed, ((iname, shape, dtype), op, arg) in enumerate(cases(args.quick)):
        if op == "blur":
            name = f"{iname} blur k={arg}"
        elif op == "filter":
            name = f"{iname} filter2d {arg[1]}x{arg[1]} {arg[0]}"
        else:
            name = f"{iname} contour"
        if args.only and args.only not in name:
            continue
        img = image(shape, dtype, seed)
        if op == "blur":
            k = arg

            def ours(img=img, k=k):
                return imgfilter.blur(img, k, backend="cpu")

            def theirs(img=img, k=k):
                return cv2.blur(img, (k, k))
        elif op == "filter":
            kind, k = arg
            kernel = gaussian(k) if kind == "gauss" else random_kernel(k, seed)

            def ours(img=img, kernel=kernel):
                return imgfilter.filter2d(img, kernel, backend="cpu")

            def theirs(img=img, kernel=kernel):
                return cv2.filter2D(img, -1, kernel)
        else:

            def ours(img=img):
                return imgfilter.contour(img, backend="cpu")

            def theirs(img=img):
                return ref.contour(img)

        t_ours, t_cv2 = paired_ms(ours, theirs, args.reps)
        path = op
        if op == "filter":
            path = cpu.correlate_plan(img.reshape(img.shape[0], img.shape[1], -1), kernel, 0.0)[0]
        a, b = ours(), theirs()
        diff = float(np.abs(a.astype(np.float64) - b.reshape(a.shape).astype(np.float64)).max())
        ratio = t_ours / t_cv2
        line = f"{name:<44} {t_ours:>12.1f} {t_cv2:>9.1f} {ratio:>6.2f} {diff:>10.3g} {path:>9}"
        print(line, flush=True)
        rows.append(
            dict(
                case=name,
                op=op,
                image=iname,
                arg=arg,
                imgfilter_ms=t_ours,
                cv2_ms=t_cv2,
                ratio=ratio,
                max_abs_diff=diff,
                path=path,
            )  # fmt: skip
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "results": rows}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
