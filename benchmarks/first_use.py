"""First use: wall time of whole commands and of each API function's first call, on an
empty kernel cache (GPU machine).

    python benchmarks/first_use.py OUTDIR > RESULTS/DATE-DEVICE-cold-start.txt
    python benchmarks/first_use.py --call OP      # one first call, in this process

The commands (`blur`, `blur --backend cuda`, `contour`, `filter` with a 21x21 kernel on
the sample photo resized to 2495x2167; `train` and `classify` on the 512x512 sample)
run three times each, run 1 on a fresh kernel cache (so with the kernels shipped in
the package only), beside OpenCV one-liners doing the same I/O and bare imports. Then
each API function's first call (2167x2495x3 uint8 and 21x21 kernels; softmax
4096x1024 float32; GEMV 4096x4096 float16; classify 512x512) in a fresh process with
an empty cache. The modules are byte-compiled first, as `pip install` leaves them.
Output: a header line, then `LABEL  SECONDS s` lines and one `first OP ...` line per
function, which benchmarks/report.py parses into BENCHMARKS.md's "Cold start".
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPS = ("blur", "filter2d", "contour", "softmax", "gemv", "train", "predict")


def _call(op: str):
    """A function running `op` once on fixed inputs."""
    import numpy as np

    rng = np.random.default_rng(0)
    if op in ("blur", "filter2d", "contour"):
        import imgfilter

        img = rng.integers(0, 256, (2167, 2495, 3), dtype=np.uint8)
        kernel = rng.standard_normal((21, 21)).astype(np.float32) / 21
        return {
            "blur": lambda: imgfilter.blur(img, 21),
            "filter2d": lambda: imgfilter.filter2d(img, kernel),
            "contour": lambda: imgfilter.contour(img),
        }[op]
    if op == "softmax":
        from kernels.softmax import softmax

        x = rng.standard_normal((4096, 1024)).astype(np.float32)
        return lambda: softmax(x)
    if op == "gemv":
        from kernels.linalg.gemv import gemv

        a = rng.standard_normal((4096, 4096)).astype(np.float16)
        v = rng.standard_normal(4096).astype(np.float16)
        return lambda: gemv(a, v)
    from imgfilter import classify

    img = rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)
    labels = np.zeros((512, 512), np.uint8)
    labels[:40, :40], labels[-40:, -40:], labels[200:240, 200:240] = 1, 2, 3
    if op == "train":
        return lambda: classify.train(img, labels, backend="cuda")
    model = classify.load(ROOT / "samples/classify/astronaut.model.npz")
    return lambda: classify.predict(img, model, backend="cuda")


def first_call(op: str) -> str:
    """One line: imports and inputs, the first call, the second, and whether Numba loaded."""
    t0 = time.perf_counter()
    run = _call(op)
    t1 = time.perf_counter()
    run()
    t2 = time.perf_counter()
    run()
    t3 = time.perf_counter()
    numba = "numba" in sys.modules
    return (
        f"first {op:9s} imports+inputs {t1 - t0:5.2f} s  first call {t2 - t1:5.2f} s  "
        f"total {t2 - t0:5.2f} s  second call {t3 - t2:5.2f} s  numba imported: {numba}"
    )


def _fresh_caches() -> dict[str, str]:
    """The environment with empty kernel and Numba caches."""
    return {
        **os.environ,
        "IMGFILTER_CACHE_DIR": tempfile.mkdtemp(prefix="imgfilter-kernels-"),
        "NUMBA_CACHE_DIR": tempfile.mkdtemp(prefix="imgfilter-numba-"),
    }


def wall(label: str, cmd: list[str], env: dict[str, str]) -> None:
    """Runs `cmd` and prints `label  seconds s` (and its last error line if it failed)."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    elapsed = time.perf_counter() - t0
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  ({label} failed: {last})")
    print(f"{label:<58} {elapsed:6.2f} s", flush=True)


def _header() -> str:
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        ).stdout.splitlines()[0]  # fmt: skip
    except (OSError, subprocess.CalledProcessError, IndexError):
        gpu = "no GPU found"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"# {gpu}, {os.cpu_count()} CPUs, {now}, tree {commit or 'unknown'}"


def run_all(out: Path) -> None:
    """Every command and first call, printed as benchmarks/report.py reads them."""
    import cv2
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    subprocess.run([py, "-m", "compileall", "-q", "-j", "0", "imgfilter", "kernels"],
                   cwd=ROOT, capture_output=True)  # fmt: skip
    img = out / "in.jpg"
    cv2.imwrite(str(img), cv2.resize(cv2.imread(str(ROOT / "samples/astronaut.jpg")), (2495, 2167)))
    k21 = out / "k21.npy"
    np.save(k21, np.random.default_rng(0).standard_normal((21, 21)).astype(np.float32) / 21)
    print(_header())
    env = _fresh_caches()
    cli = [py, "-m", "imgfilter"]
    sample, strokes = "samples/astronaut.jpg", "samples/classify/astronaut.scribbles.png"
    model = "samples/classify/astronaut.model.npz"
    commands = {
        "imgfilter blur --k 21": ["blur", img, "--k", "21", "-o", out / "b.jpg"],
        "imgfilter blur --k 21 --backend cuda":
            ["blur", img, "--k", "21", "-o", out / "b.jpg", "--backend", "cuda"],
        "imgfilter contour": ["contour", img, "-o", out / "c.png"],
        "imgfilter filter --kernel k21.npy": ["filter", img, "--kernel", k21, "-o", out / "f.jpg"],
        "imgfilter train 512x512": ["train", sample, strokes, "-o", out / "m.npz"],
        "imgfilter classify 512x512": ["classify", sample, "--model", model, "-o", out / "l.png"],
    }  # fmt: skip
    for label, args in commands.items():
        for run in (1, 2, 3):
            wall(f"{label} (run {run})", [*cli, *map(str, args), "--force"], env)
    cv_blur = f"import cv2; cv2.imwrite('{out}/cb.jpg', cv2.blur(cv2.imread('{img}'), (21, 21)))"
    cv_filter = (
        f"import cv2, numpy as np; cv2.imwrite('{out}/cf.jpg', "
        f"cv2.filter2D(cv2.imread('{img}'), -1, np.load('{k21}')))"
    )
    for _ in range(2):
        wall("cv2 one-liner: imread + blur 21 + imwrite", [py, "-c", cv_blur], env)
        wall("cv2 one-liner: imread + filter2D 21x21 + imwrite", [py, "-c", cv_filter], env)
    for label, code in (("python3 -c pass", "pass"), ("import numpy", "import numpy"),
                        ("import cv2", "import cv2"),
                        ("from numba import cuda", "from numba import cuda")):  # fmt: skip
        wall(label, [py, "-c", code], env)
    wall("imgfilter --help", [*cli, "--help"], env)
    for op in OPS:
        done = subprocess.run([py, __file__, "--call", op], capture_output=True, text=True,
                              env=_fresh_caches(), cwd=ROOT)  # fmt: skip
        print(done.stdout.strip() or f"  (first {op} failed: {done.stderr.strip()[-200:]})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", type=Path, help="where the inputs and outputs go")
    parser.add_argument("--call", choices=OPS, help="time one API function's first call")
    args = parser.parse_args(argv)
    if args.call:
        print(first_call(args.call))
    elif args.outdir is not None:
        run_all(args.outdir)
    else:
        parser.error("give OUTDIR, or --call OP")
    return 0


if __name__ == "__main__":
    sys.exit(main())
