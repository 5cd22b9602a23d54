"""Time the size-generic filter2d kernels (weights read at run time) on the GPU.

    python benchmarks/generic_filter.py [--sizes seed,4k] [--k 3,5,9,15,21,31,41,51]
        [--dtypes uint8,float32] [--json FILE]

Method auto runs a size-generic kernel where the register-blocked kernel is not
compiled yet (its first use of a kernel size) or cannot take the kernel (larger than
31x31). For each image size, dtype and kernel size: the GPU kernel time (launches
queued behind a spin kernel, `imgfilter.bench.Timer`) of methods window, tiled,
blocked (up to 31x31) and padded (where tiled's tile does not fit), the per-call time
of window from Python (a call and a synchronisation), TFMA/s, and each method's ratio
to window, beside torch's depthwise conv2d and CuPy's correlate (float32) measured in
the same run. Every method's output is checked against window's bit for bit; at the
seed size window's is checked against cv2.filter2D as well.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json

import numpy as np


def _peers(timer, img, weights, k: int) -> dict:
    from imgfilter import bench

    found = {}
    torch = bench._torch()
    if torch is not None:
        found["torch conv2d float32"] = timer.kernel_us(
            bench._torch_depthwise(torch, img, weights), 5
        )
    try:
        import cupy
        from cupyx.scipy import ndimage
    except ImportError:
        return found
    if k <= 21:  # CuPy's correlate takes seconds per call past that
        c_f = cupy.asarray(img).astype(cupy.float32)
        c_w = cupy.asarray(weights)[:, :, None]
        fn = functools.partial(ndimage.correlate, c_f, c_w, mode="mirror")
        found["cupy correlate float32"] = timer.kernel_us(fn, 3)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="seed,4k")
    parser.add_argument("--k", default="3,5,9,15,21,31,41,51")
    parser.add_argument("--dtypes", default="uint8,float32")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()

    import cv2
    from numba import cuda

    import imgfilter
    from imgfilter import bench
    from kernels.conv import plan as conv_plan

    timer = bench.Timer()
    device = cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else str(device)
    print(f"device: {device}")
    rng = np.random.default_rng(0)
    rows = []
    for dtype in args.dtypes.split(","):
        for size in args.sizes.split(","):
            shape = bench.SHAPES[size]
            if dtype == "float32":
                img = (rng.standard_normal(shape) * 50).astype(np.float32)
            else:
                img = rng.integers(0, 256, shape, dtype=np.uint8)
            d_img = cuda.to_device(img)
            d_out = cuda.device_array_like(d_img)
            for k in (int(v) for v in args.k.split(",")):
                weights = (rng.standard_normal((k, k)) / k).astype(np.float32)
                methods = ["window"]
                if conv_plan.fits(k, k):
                    methods.append("blocked")
                methods.append("tiled" if conv_plan.tiled_fits(k, k) else "padded")
                if not conv_plan.window_fits(k, k):
                    methods.remove("window")
                times, first = {}, None
                for method in methods:
                    call = functools.partial(
                        imgfilter.filter2d, d_img, weights, method=method, out=d_out
                    )
                    call()
                    cuda.synchronize()
                    got = d_out.copy_to_host()
                    if first is None:
                        first = got
                        if size == "seed":
                            want = cv2.filter2D(img, -1, weights, borderType=cv2.BORDER_REFLECT_101)
                            diff = np.abs(got.astype(np.float64) - want).max()
                            assert diff <= (1 if dtype == "uint8" else 1e-3 * np.abs(want).max()), (
                                diff
                            )
                    else:
                        assert np.array_equal(got, first), f"{method} differs from {methods[0]}"
                    times[method] = timer.kernel_us(call, 5 if k > 31 else 10)
                window_call = None
                if "window" in times:
                    call = functools.partial(
                        imgfilter.filter2d, d_img, weights, method="window", out=d_out
                    )
                    window_call = timer.call_us(call, 10)
                peers = _peers(timer, img, weights, k)
                fmas = img.size * k * k
                base = times.get("window")
                for name, us in [
                    *((f"imgfilter {m}", t) for m, t in times.items()),
                    *peers.items(),
                ]:
                    ratio = f"{us / base:7.2f}x" if base else "       "
                    print(
                        f"{dtype:8s} {size:5s} {k:2d}x{k:<2d} {name:24s} {us:10.1f} us "
                        f"{fmas / us / 1e6:6.2f} TFMA/s {ratio} window's time",
                        flush=True,
                    )
                    rows.append(dict(dtype=dtype, size=size, shape=list(shape), k=k, method=name,
                                     kernel_us=us, tfma_s=fmas / us / 1e6))  # fmt: skip
                if window_call is not None:
                    print(
                        f"{dtype:8s} {size:5s} {k:2d}x{k:<2d} imgfilter window per call "
                        f"{window_call:10.1f} us"
                    )
                    rows.append(dict(dtype=dtype, size=size, shape=list(shape), k=k,
                                     method="imgfilter window", call_us=window_call))  # fmt: skip
    if args.json:
        meta = dict(device=device, date=datetime.datetime.now(datetime.timezone.utc).isoformat())
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
