"""Wall time of the first call of one API function in this (fresh) process, including
imports and CUDA context creation: `python benchmarks/first_call.py OP` with OP one of
blur, filter2d, contour, softmax, gemv, train, predict. Prints one line: the import
time, the first call, the second call (same arguments), and whether Numba was
imported. benchmarks/cold_start.sh runs it with an empty kernel cache.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OPS = ("blur", "filter2d", "contour", "softmax", "gemv", "train", "predict")


def _call(op: str):
    """A function running `op` once on fixed inputs of the issue's sizes."""
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


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in OPS:
        print(f"usage: first_call.py {{{','.join(OPS)}}}", file=sys.stderr)
        return 2
    op = sys.argv[1]
    t0 = time.perf_counter()
    run = _call(op)
    t1 = time.perf_counter()
    run()
    t2 = time.perf_counter()
    run()
    t3 = time.perf_counter()
    numba = "numba" in sys.modules
    print(
        f"first {op:9s} imports+inputs {t1 - t0:5.2f} s  first call {t2 - t1:5.2f} s  "
        f"total {t2 - t0:5.2f} s  second call {t3 - t2:5.2f} s  numba imported: {numba}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
