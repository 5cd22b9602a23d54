"""box_tiled's kernel time against the image height at a fixed width (GPU only).

Where the seed-size box blur's time goes that does not scale with the image: for
uint8 RGB images of --width columns and each height, the kernel time of `box_auto`'s
box_tiled at its default geometry (launches queued behind a spin kernel,
imgfilter.bench's Timer), the tiles, the waves of resident blocks (tiles over the
blocks per SM, times the SMs, that the launch bounds or else the threads and shared
memory allow: 2048 threads and 228 KiB per SM, 1 KiB reserved per block), and a
least-squares line time = a + b * Mpixel over the heights. Steps at whole waves
would show wave quantization; a large intercept with no steps, a per-launch cost
(ramp-up and drain).

    python benchmarks/box_tiles_curve.py --json curve.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HEIGHTS = [64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2167, 2560, 3072, 4334]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2495)
    parser.add_argument("--k", type=int, default=21)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    from numba import cuda

    from imgfilter.bench import Timer
    from kernels.box import plan as box_plan
    from kernels.box import tiled as ktiled

    timer = Timer()
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    rng = np.random.default_rng(0)
    k, a = (args.k, args.k), (args.k // 2, args.k // 2)
    rows = []
    for h in HEIGHTS:
        img = rng.integers(0, 256, (h, args.width, 3), dtype=np.uint8)
        d_img, d_out = cuda.to_device(img), cuda.device_array(img.shape, np.uint8)
        geo = box_plan.tiled_plan(img.shape, img.dtype, k)
        ktiled.box_tiled(d_img, k, a, 0, 0, d_out, geo)
        us = timer.kernel_us(lambda g=geo, i=d_img, o=d_out: ktiled.box_tiled(i, k, a, 0, 0, o, g))
        tiles = geo["grid"][0] * geo["grid"][1]
        per_sm = geo["min_blocks"] or min(2048 // geo["threads"], 233472 // (geo["smem"] + 1024))
        waves = tiles / (per_sm * sms)
        rows.append(dict(height=h, mpixel=h * args.width / 1e6, tiles=tiles, waves=waves, us=us))
        print(f"h={h:5} {h * args.width / 1e6:6.2f} Mpx {tiles:5} tiles {waves:5.2f} waves "
              f"{us:7.1f} us", flush=True)  # fmt: skip
    mpx = np.array([r["mpixel"] for r in rows])
    us = np.array([r["us"] for r in rows])
    b, a0 = np.polyfit(mpx, us, 1)
    print(f"fit: {a0:.1f} us + {b:.2f} us per Mpixel")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(width=args.width, k=args.k, sms=sms, rows=rows, fit=[a0, b]), fh,
                      indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
