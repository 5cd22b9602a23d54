"""Large device images (taller than one launch grid, 32768 rows, or of 2 GiB or more;
issue 27 "any image size"): GPU time of blur ("blur K"), filter2d 21x21 and contour on
a CuPy image, the device memory the call takes besides the image and its result, and
a checksum of each result (to compare two trees' results without copying them to the
host).

    python benchmarks/tall_device.py [--sizes 32768x65536,65536x65536] [--json FILE]

Each size is HxW of a uint8 (H, W, 3) image of random values. The floor is the
image's and the result's bytes at the device copy bandwidth measured in the same
run (`cupy.copyto` of the image). A 32768-row image is filtered in one launch grid,
so its time per pixel is the bands' baseline. Needs a GPU and CuPy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _filled(cp, shape: tuple):
    """A uint8 image of random values, filled a slice of rows at a time (a random
    draw of the whole would need several times its memory)."""
    img = cp.empty(shape, cp.uint8)
    rng = cp.random.default_rng(0)
    step = max(1, (1 << 28) // (shape[1] * shape[2]))
    for y in range(0, shape[0], step):
        part = img[y : y + step]
        part[...] = rng.integers(0, 256, part.shape, dtype=cp.int32).astype(cp.uint8)
    return img


def _gpu_ms(cp, fn, reps: int) -> float:
    """Median milliseconds of GPU time of fn()'s queued work, one call at a time."""
    times = []
    for _ in range(reps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def _checksum(cp, out) -> int:
    """Sum over rows of (row index + 1) x the row's sum, modulo 2^64."""
    rows = out.reshape(out.shape[0], -1).sum(axis=1, dtype=cp.uint64)
    return int((rows * (cp.arange(out.shape[0], dtype=cp.uint64) + 1)).sum())


def _copy_gbs(cp, img) -> float:
    """Device copy bandwidth (bytes read + written per second, GB/s) copying `img`."""
    tmp = cp.empty_like(img)
    ms = _gpu_ms(cp, lambda: cp.copyto(tmp, img), 3)
    tmp = None
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * img.nbytes / ms / 1e6


def _case(cp, imgfilter, name: str, img, reps: int, copy_gbs: float) -> dict:
    kernel = (cp.random.default_rng(1).standard_normal((21, 21)) / 21).get().astype("float32")
    shape = img.shape[:2] if name == "contour" else img.shape
    out = cp.empty(shape, cp.uint8)
    if name.startswith("blur "):
        k = int(name.split()[1])

        def call():
            return imgfilter.blur(img, k, out=out)
    else:
        call = {
            "filter2d 21x21": lambda: imgfilter.filter2d(img, kernel, out=out),
            "contour": lambda: imgfilter.contour(img, out=out),
        }[name]
    cp.cuda.Device().synchronize()
    free_before = cp.cuda.runtime.memGetInfo()[0]
    call()
    cp.cuda.Device().synchronize()
    extra = free_before - cp.cuda.runtime.memGetInfo()[0]
    ms = _gpu_ms(cp, call, reps)
    floor_ms = (img.nbytes + out.nbytes) / copy_gbs / 1e6
    gpix = img.shape[0] * img.shape[1] / 1e9
    return {"case": name, "shape": list(img.shape), "gpu_ms": ms, "floor_ms": floor_ms,
            "x_floor": ms / floor_ms, "ms_per_gpix": ms / gpix, "copy_gbs": copy_gbs,
            "extra_device_mb": extra / 1e6, "checksum": _checksum(cp, out)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="32768x65536,65536x65536")
    parser.add_argument("--cases", default="blur 21,filter2d 21x21,contour")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--label", default="")
    parser.add_argument("--json")
    args = parser.parse_args()
    try:
        import cupy as cp

        import imgfilter

        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback
        print(f"tall_device: needs a CUDA GPU and CuPy: {exc}", file=sys.stderr)
        return 2
    rows = []
    for size in args.sizes.split(","):
        h, w = (int(n) for n in size.split("x"))
        img = _filled(cp, (h, w, 3))
        copy_gbs = _copy_gbs(cp, img)
        for name in args.cases.split(","):
            rows.append(_case(cp, imgfilter, name, img, args.reps, copy_gbs))
        del img
        cp.get_default_memory_pool().free_all_blocks()
    print(f"{'case':16s} {'image':>18s} {'GPU ms':>9s} {'floor ms':>9s} {'x floor':>8s} "
          f"{'ms/Gpix':>8s} {'extra MB':>9s} checksum {args.label}")  # fmt: skip
    for r in rows:
        image = "x".join(str(n) for n in r["shape"])
        print(f"{r['case']:16s} {image:>18s} {r['gpu_ms']:9.2f} {r['floor_ms']:9.2f} "
              f"{r['x_floor']:8.2f} {r['ms_per_gpix']:8.2f} {r['extra_device_mb']:9.1f} "
              f"{r['checksum']}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
