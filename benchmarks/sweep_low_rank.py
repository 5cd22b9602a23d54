"""Time low-rank k x k kernels through separable passes and one 2-D pass on the GPU.

    python benchmarks/sweep_low_rank.py [--ks 5,7,9,11,15,21,25,31] [--size seed]
        [--max-rank 8] [--json FILE]

For each k and each rank from 1 to min(--max-rank, conv_plan.max_separable_rank(k, k)),
a random kernel of that rank (`imgfilter.bench.low_rank_launches`) is correlated with
the uint8 image through method separable and method blocked; the two outputs are
compared (a row says MAX DIFF where they are more than 1 apart) and timed with
`imgfilter.bench.Timer` (launches queued behind a spin kernel). The table gives the
median kernel times and their ratio: what `kernels.conv.plan.separable_pays` is fitted to.

--once runs each launch twice and times nothing (for a profiler: ncu --clock-control none).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from numba import cuda

from imgfilter import bench
from kernels.conv.plan import max_separable_rank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="5,7,9,11,15,21,25,31")
    parser.add_argument("--size", default="seed", help="seed, 4k, 8k or HxW (x3 channels)")
    parser.add_argument("--max-rank", type=int, default=8)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--once", action="store_true", help="no timing: for a profiler")
    args = parser.parse_args()
    if args.size in bench.SHAPES:
        shape = bench.SHAPES[args.size]
    else:
        h, w = (int(v) for v in args.size.split("x"))
        shape = (h, w, 3)
    img = np.random.default_rng(7).integers(1, 256, shape, dtype=np.uint8)
    timer = bench.Timer()
    name = getattr(cuda.get_current_device(), "name", b"simulator")
    name = name.decode() if isinstance(name, bytes) else str(name)
    print(f"device: {name}, image {shape}")
    print(f"{'k':>3} {'rank':>4} {'blocked us':>11} {'separable us':>13} {'sep/blk':>8}")
    rows = []
    for k in (int(v) for v in args.ks.split(",")):
        for rank in range(1, min(args.max_rank, max_separable_rank(k, k)) + 1):
            launches = bench.low_rank_launches(img, k, rank)
            outs = {}
            times = {}
            for method, fn, _taps in launches:
                outs[method] = fn().copy_to_host()
                fn()
                times[method] = 0.0 if args.once else timer.kernel_us(fn, 10)
            diff = int(np.abs(outs["blocked"].astype(int) - outs["separable"]).max())
            ratio = times["separable"] / times["blocked"] if not args.once else float("nan")
            print(
                f"{k:>3} {rank:>4} {times['blocked']:>11.1f} {times['separable']:>13.1f}"
                f" {ratio:>8.2f}" + (f"  MAX DIFF {diff}" if diff > 1 else "")
            )
            rows.append({"k": k, "rank": rank, **times, "max_diff": diff})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "shape": shape, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
