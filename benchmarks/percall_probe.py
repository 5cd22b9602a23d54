"""Where the host time of a GPU call goes (GPU and CuPy needed).

Queues `--calls` calls of one operation on a CuPy device image (after a warm-up call
that records its launches), prints the host microseconds per call, then a cProfile of
the same loop by own time. The pipeline view with the peers is
`imgfilter bench --pipeline`.

    python benchmarks/percall_probe.py [--op blur|filter2d|gaussian|contour|softmax|gemv]
                                       [--shape 64x64x3] [--k 3] [--calls 2000]

softmax takes --shape ROWSxCOLS (float32); gemv --shape NxK (float16, x of K).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

OPS = ("blur", "filter2d", "gaussian", "contour", "softmax", "gemv")


def _operation(name: str, k: int):
    import imgfilter

    if name == "softmax":
        from kernels.softmax import softmax

        return softmax
    if name == "gemv":
        from kernels.gemv import gemv

        return lambda ax: gemv(*ax)

    if name == "blur":
        return lambda d: imgfilter.blur(d, k)
    if name == "filter2d":
        weights = np.random.default_rng(0).random((k, k), dtype=np.float32)
        return lambda d: imgfilter.filter2d(d, weights)
    if name == "gaussian":
        g = np.exp(-((np.arange(k) - k // 2) ** 2) / (2 * (0.3 * k) ** 2)).astype(np.float32)
        weights = np.outer(g, g) / np.outer(g, g).sum()
        return lambda d: imgfilter.filter2d(d, weights)
    return lambda d: imgfilter.contour(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="blur", choices=OPS)
    ap.add_argument("--shape", default="64x64x3")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()

    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no CuPy, no driver, no device
        raise SystemExit(f"percall_probe needs CuPy and an NVIDIA GPU: {exc}") from None

    shape = tuple(int(n) for n in args.shape.split("x"))
    rng = np.random.default_rng(1)
    if args.op == "softmax":
        d = cp.asarray(rng.standard_normal(shape, dtype=np.float32))
    elif args.op == "gemv":
        d = (cp.asarray(rng.standard_normal(shape).astype(np.float16)),
             cp.asarray(rng.standard_normal(shape[1]).astype(np.float16)))  # fmt: skip
    else:
        d = cp.asarray(rng.integers(1, 256, shape, dtype=np.uint8))
    op = _operation(args.op, args.k)
    op(d)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        op(d)
    host = (time.perf_counter() - t0) / args.calls * 1e6
    cp.cuda.Device().synchronize()
    print(f"{args.op} {args.shape} k={args.k}: {host:.1f} us of host time per call")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.calls):
        op(d)
    profile.disable()
    cp.cuda.Device().synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
