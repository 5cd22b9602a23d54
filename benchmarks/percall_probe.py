"""Where the host time of a GPU call goes (GPU and CuPy needed).

Queues `--calls` calls of one operation on a CuPy device image (after a warm-up call
that records its launches), prints the host microseconds per call, then a cProfile of
the same loop by own time. The pipeline view with the peers is
`imgfilter bench --pipeline`.

    python benchmarks/percall_probe.py [--op blur|filter2d|gaussian|contour|softmax|gemv|
                                        varshape] [--shape 64x64x3] [--k 3] [--calls 2000]

softmax takes --shape ROWSxCOLS (float32); gemv --shape NxK (float16, x of K).
varshape: one `imgfilter.blur_batch` call on a list of --frames uint8 RGB frames of
sizes between 480p and 1080p (seeded), box --k; CV-CUDA's var-shape averageblur
(an ImageBatchVarShape, per-image kernel sizes and anchors) beside it where cvcuda
is importable.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

OPS = ("blur", "filter2d", "gaussian", "contour", "softmax", "gemv", "varshape")


def _operation(name: str, k: int):
    import imgfilter

    if name == "softmax":
        from kernels.softmax import softmax

        return softmax
    if name == "gemv":
        from kernels.linalg.gemv import gemv

        return lambda ax: gemv(*ax)

    if name == "varshape":
        return lambda frames: imgfilter.blur_batch(frames, k)
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
    ap.add_argument("--frames", type=int, default=32, help="varshape: frames per call")
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
    elif args.op == "varshape":
        d = _mixed_frames(cp, rng, args.frames)
    else:
        d = cp.asarray(rng.integers(1, 256, shape, dtype=np.uint8))
    op = _operation(args.op, args.k)
    what = f"{args.frames} frames 480p-1080p" if args.op == "varshape" else args.shape
    host, device = _per_call(cp, op, d, args.calls)
    print(f"{args.op} {what} k={args.k}: {host:.1f} us of host time per call, "
          f"{device:.1f} us per call with the GPU's time")  # fmt: skip
    if args.op == "varshape":
        _cvcuda_varshape(cp, d, args.k, args.calls)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.calls):
        op(d)
    profile.disable()
    cp.cuda.Device().synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(20)


def _mixed_frames(cp, rng, n: int) -> list:
    """n uint8 RGB device frames of random sizes between 480p and 1080p."""
    sizes = [(int(rng.integers(480, 1081)), int(rng.integers(640, 1921))) for _ in range(n)]
    return [cp.asarray(rng.integers(1, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def _per_call(cp, op, d, calls: int) -> tuple[float, float]:
    """(host microseconds per call of `calls` queued calls, microseconds per call
    until the GPU has done them), after one warm-up call."""
    op(d)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        op(d)
    host = (time.perf_counter() - t0) / calls * 1e6
    cp.cuda.Device().synchronize()
    return host, (time.perf_counter() - t0) / calls * 1e6


def _cvcuda_varshape(cp, frames: list, k: int, calls: int) -> None:
    """CV-CUDA's var-shape averageblur of the same frames (reflect101), when importable."""
    try:
        import cvcuda
    except Exception as exc:  # noqa: BLE001 - a peer, optional
        print(f"cvcuda varshape averageblur: skipped (cvcuda not importable: {exc})")
        return
    sizes = cp.asarray(np.full((len(frames), 2), k, dtype=np.int32))
    anchors = cp.asarray(np.full((len(frames), 2), -1, dtype=np.int32))
    border = cvcuda.Border.REFLECT101
    try:
        batch = cvcuda.ImageBatchVarShape(len(frames))
        for f in frames:
            batch.pushback(cvcuda.as_image(f))
        ksize, kanchor = cvcuda.as_tensor(sizes, "NC"), cvcuda.as_tensor(anchors, "NC")

        def op(src):
            return cvcuda.averageblur(src, (k, k), ksize, kanchor, border)

        host, device = _per_call(cp, op, batch, calls)
    except Exception as exc:  # noqa: BLE001 - a peer whose API differs: say so, go on
        print(f"cvcuda varshape averageblur: failed ({exc!r})")
        return
    print(f"cvcuda varshape averageblur {len(frames)} frames k={k}: {host:.1f} us of host "
          f"time per call, {device:.1f} us per call with the GPU's time")  # fmt: skip


if __name__ == "__main__":
    main()
