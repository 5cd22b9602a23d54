"""Where the per-call time of `imgfilter.blur` on a device array goes (GPU only).

Times, on a seed-size uint8 RGB device image: the public call (synchronised), the
same call without synchronising (Python-side cost), `kernels.box.box_auto` alone, a
bare `cuda.device_array` of the output's size, and prints a cProfile of the public
calls' top entries by cumulative time.

    python benchmarks/percall_probe.py [--k 21] [--calls 50]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import numpy as np


def _wall_us(fn, calls: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=21)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()

    from numba import cuda

    import imgfilter
    from kernels import box as kbox

    k, calls = args.k, args.calls
    img = np.random.default_rng(0).integers(0, 256, (2167, 2495, 3), dtype=np.uint8)
    d_img = cuda.to_device(img)
    d_out = cuda.device_array_like(d_img)
    sync = cuda.synchronize

    def nothing():
        return None

    figures = {
        "imgfilter.blur(device), synchronised": _wall_us(
            lambda: imgfilter.blur(d_img, k), calls, sync
        ),
        "imgfilter.blur(device), not synchronised": _wall_us(
            lambda: imgfilter.blur(d_img, k), calls, nothing
        ),
        "box_auto into a given output, synchronised": _wall_us(
            lambda: kbox.box_auto(d_img, (k, k), (k // 2, k // 2), 0, 0, d_out), calls, sync
        ),
        "box_auto into a given output, not synchronised": _wall_us(
            lambda: kbox.box_auto(d_img, (k, k), (k // 2, k // 2), 0, 0, d_out), calls, nothing
        ),
        "cuda.device_array of the image's size": _wall_us(
            lambda: cuda.device_array(img.shape, np.uint8), calls, nothing
        ),
    }
    for what, us in figures.items():
        print(f"{us:9.1f} us  {what}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        imgfilter.blur(d_img, k)
        sync()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
    print(out.getvalue())


if __name__ == "__main__":
    main()
