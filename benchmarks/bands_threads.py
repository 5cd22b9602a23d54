"""Large host images filtered from several threads at once (issue 27): the many-files
pipeline on big frames, or a Dask worker with threads, each call in row bands
(`imgfilter.streamed`, the default for host images of 32 MiB or more; the band streams
are shared by all callers). Wall time of `--count` blur 21 calls on distinct
`--size`^2 x3 uint8 images, one thread after another against `--threads` threads, in
bands and in one piece (`max_gpu_bytes` past the need), beside the PCIe floor (bytes
in and out at the pinned host<->device bandwidth measured here). Checks that the
threaded results equal the sequential ones. Needs a GPU.

    python benchmarks/bands_threads.py [--size 8192] [--count 8] [--threads 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def _run(images: list, threads: int, budget: int | None) -> tuple[float, list]:
    import imgfilter

    def one(img):
        return imgfilter.blur(img, 21, max_gpu_bytes=budget)

    t = time.perf_counter()
    if threads == 1:
        out = [one(img) for img in images]
    else:
        with ThreadPoolExecutor(threads) as pool:
            out = list(pool.map(one, images))
    return time.perf_counter() - t, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    from streamed_bench import _pcie_gbs  # benchmarks/, this script's folder

    from kernels.common.cudadrv import driver

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)
              for _ in range(args.count)]  # fmt: skip
    nbytes = images[0].nbytes
    up, down = _pcie_gbs(nbytes)
    floor = args.count * (nbytes / up + nbytes / down) / 1e9
    rows, want = [], None
    for label, budget in (("bands (default)", None), ("one piece", 1 << 62)):
        for threads in (1, args.threads):
            _run(images[:2], threads, budget)  # warm-up: kernels, pinned buffers, pool
            times = []
            for _ in range(args.reps):
                seconds, out = _run(images, threads, budget)
                times.append(seconds)
            if want is None:
                want = out
            same = all(np.array_equal(a, b) for a, b in zip(want, out, strict=True))
            median = float(np.median(times))
            rows.append({"path": label, "threads": threads, "seconds": median,
                         "x_floor": median / floor, "identical": same})  # fmt: skip
    print(f"{driver().name()}: {args.count} blur 21 calls on {args.size}x{args.size}x3 uint8 "
          f"({nbytes / 1e6:.0f} MB each); PCIe floor {floor * 1e3:.0f} ms "
          f"(H2D {up:.1f}, D2H {down:.1f} GB/s pinned); median of {args.reps}")  # fmt: skip
    print(f"{'path':18} {'threads':>7} {'ms':>9} {'x floor':>8}  identical")
    for r in rows:
        print(f"{r['path']:18} {r['threads']:>7} {r['seconds'] * 1e3:>9.1f} "
              f"{r['x_floor']:>8.2f}  {r['identical']}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": driver().name(), "size": args.size, "count": args.count,
                       "floor_s": floor, "rows": rows}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
