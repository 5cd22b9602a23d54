"""Run fast kernels a few times on seed-size random data, for a profiler (GPU only).

    ncu --clock-control none -k regex:'box_fused|contour_fused' \
        python benchmarks/profile_once.py --op box --op contour

--op picks what runs (repeatable): box (k=21 box through box_auto, uint8 RGB), packed
(the same through kernels.box.packed), tiled (through kernels.box.tiled), twopass (through
kernels.box.twopass; use --k 101), contour (gray),
filter2d (a random full-rank 21x21 kernel through `kernels.conv.blocked`), fma (the
FMA-rate probe of `imgfilter.bench`).
"""

from __future__ import annotations

import argparse

import numpy as np
from numba import cuda

OPS = ("box", "packed", "tiled", "twopass", "contour", "filter2d", "fma")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", action="append", choices=OPS, help="default: box, contour")
    parser.add_argument("--k", type=int, default=21, help="box or filter size")
    args = parser.parse_args()
    ops = args.op or ["box", "contour"]
    k = args.k
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (2167, 2495, 3), dtype=np.uint8)
    d_img = cuda.to_device(img)
    for _ in range(2):
        if "box" in ops:
            from kernels.box import dispatch as kbox

            kbox.box_auto(d_img, (k, k), (k // 2, k // 2), 0, 0)
        if "packed" in ops:
            from kernels.box import packed as box_packed

            box_packed.box_packed(d_img, (k, k), (k // 2, k // 2), 0, 0)
        if "tiled" in ops:
            from kernels.box import tiled as box_tiled

            box_tiled.box_tiled(d_img, (k, k), (k // 2, k // 2), 0, 0)
        if "twopass" in ops:
            from kernels.box import twopass as box_twopass

            box_twopass.box_twopass(d_img, (k, k), (k // 2, k // 2), 0, 0)
        if "contour" in ops:
            from kernels.contour import kernel as kcontour

            d_gray = cuda.to_device(np.ascontiguousarray(img[:, :, 1:2]))
            kcontour.contour(d_gray, 0, 0)
        if "filter2d" in ops:
            from kernels.conv import blocked as conv_blocked

            weights = cuda.to_device(rng.standard_normal((k, k)).astype(np.float32) / k)
            out = cuda.device_array_like(d_img)
            conv_blocked.correlate_blocked(d_img, weights, (k // 2, k // 2), 0, 0.0, out)
        if "fma" in ops:
            from imgfilter.bench import Timer, fma_rate_tfmas

            print(f"FMA probe: {fma_rate_tfmas(Timer()):.1f} TFMA/s")
    cuda.synchronize()


if __name__ == "__main__":
    main()
