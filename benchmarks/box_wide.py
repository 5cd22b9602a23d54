"""Wide uint8 boxes: `kernels.box.packed` against `kernels.box.running` (GPU only).

`kernels.box.plan.choose` sends a uint8 box to box_packed only when box_tiled,
box_twopass and box_fused all decline: boxes wider than 257 columns (box_twopass's
16-bit row sums) whose tile box_fused cannot hold. Without box_packed those boxes
would run on box_running. This times both (kernel time, spin-queued events as in
`imgfilter.bench`) on such boxes, checks that both equal cv2.blur, and prints a
table and writes JSON: the measurement that decides whether box_packed keeps its
place (issue 26).

    python benchmarks/box_wide.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import cv2
import numpy as np

# (height, width, channels, kh, kw): shapes the planner sends to box_packed.
CASES = [
    (2167, 2495, 3, 21, 511),
    (2167, 2495, 3, 5, 401),
    (4320, 7680, 3, 9, 511),
    (2167, 2495, 1, 3, 1001),
    (2167, 2495, 4, 21, 301),
    (720, 1280, 3, 3, 511),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    from numba import cuda

    from imgfilter.bench import Timer, copy_bandwidth_gbs
    from kernels.box import packed as box_packed
    from kernels.box import plan as box_plan
    from kernels.box.running import box_running

    timer = Timer()
    bandwidth = copy_bandwidth_gbs(timer)
    rng = np.random.default_rng(0)
    rows, failures = [], 0
    print(f"device {cuda.get_current_device().name}, copy bandwidth {bandwidth:.0f} GB/s")
    print(f"{'case':28s} {'packed us':>10s} {'running us':>11s} {'floor us':>9s}  ratio")
    for h, w, c, kh, kw in CASES:
        shape = (h, w, c)
        method = box_plan.choose(shape, np.uint8, (kh, kw))[0]
        geo = box_plan.packed_plan(shape, np.uint8, (kh, kw))
        img = rng.integers(0, 256, shape, dtype=np.uint8)
        expected = cv2.blur(img, (kw, kh), borderType=cv2.BORDER_REFLECT_101).reshape(shape)
        d_img = cuda.to_device(img)
        d_packed, d_running = cuda.device_array_like(d_img), cuda.device_array_like(d_img)
        anchor = (kh // 2, kw // 2)

        def packed(d_img=d_img, d_out=d_packed, geo=geo, k=(kh, kw), a=anchor):
            box_packed.box_packed(d_img, k, a, 0, 0, d_out, geo)

        def running(d_img=d_img, d_out=d_running, k=(kh, kw), a=anchor):
            box_running(d_img, k, a, 0, 0, d_out)

        packed_us, running_us = timer.kernel_us(packed), timer.kernel_us(running)
        same = [bool(np.array_equal(d.copy_to_host(), expected)) for d in (d_packed, d_running)]
        failures += not all(same)
        floor = 2 * img.nbytes / (bandwidth * 1e3)
        name = f"{h}x{w}x{c} box {kh}x{kw}"
        print(
            f"{name:28s} {packed_us:10.1f} {running_us:11.1f} {floor:9.1f}  "
            f"{running_us / packed_us:5.2f}  planner: {method}  exact: {same}"
        )
        rows.append(
            {"case": name, "planner": method, "packed_us": packed_us,
             "running_us": running_us, "floor_us": floor, "exact": same}
        )  # fmt: skip
    print("ratio: box_running / box_packed (> 1: box_packed is faster)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": str(cuda.get_current_device().name),
                       "copy_bandwidth_GBps": bandwidth, "rows": rows}, fh, indent=1)  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
