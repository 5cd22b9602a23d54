"""Geometry sweep for the one-pass box kernel and timing of the contour kernel (GPU only).

For each box size it times `kernels.box.fused` over threads x run x strip x batch on
a random uint8 image (kernel time, spin-queued events as in `imgfilter.bench`), next
to the two-pass `box_running`, and prints the best geometry per k; then times
`kernels.contour.kernel` on gray images. Writes everything as JSON with --json.

    python benchmarks/sweep_box.py --json sweep.json [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="a few geometries only")
    parser.add_argument("--sizes", default="seed,4k,8k", help="sizes timed with box_auto")
    args = parser.parse_args(argv)

    from numba import cuda

    from imgfilter.bench import Timer, copy_bandwidth_gbs
    from kernels.box import dispatch as kbox
    from kernels.box import fused as kfused
    from kernels.box import running as krunning
    from kernels.contour import kernel as kcontour

    timer = Timer()
    bandwidth = copy_bandwidth_gbs(timer)
    sizes = {"seed": (2167, 2495), "4k": (2160, 3840), "8k": (4320, 7680)}
    rng = np.random.default_rng(0)
    results: dict = {"copy_bandwidth_GBps": bandwidth, "box": [], "contour": []}
    print(f"device {cuda.get_current_device().name}, copy bandwidth {bandwidth:.0f} GB/s")

    img = rng.integers(0, 256, (*sizes["seed"], 3), dtype=np.uint8)
    d_img, d_out = cuda.to_device(img), cuda.device_array(img.shape, np.uint8)
    floor_us = 2 * img.nbytes / (bandwidth * 1e3)
    space = itertools.product((128, 256), (30, 32), (16, 32, 64), (8, 16))
    if args.quick:
        space = [(128, 16, 32, 8), (256, 16, 32, 8)]
    space = list(space)
    best: dict = {}
    for k in (3, 21, 101):
        anchor = (k // 2, k // 2)
        two_pass = timer.kernel_us(
            lambda k=k, a=anchor: krunning.box_running(d_img, (k, k), a, 0, 0, d_out)
        )
        print(f"k={k} box_running {two_pass:.1f} us (floor {floor_us:.1f} us)")
        results["box"].append({"k": k, "impl": "box_running", "kernel_us": two_pass})
        for threads, run, strip, batch in space:
            geo = kfused.plan(img.shape, img.dtype, (k, k), threads, run, strip, batch)
            if geo is None:
                continue
            us = timer.kernel_us(
                lambda g=geo, k=k, a=anchor: kfused.box_fused(d_img, (k, k), a, 0, 0, d_out, g)
            )
            row = {"k": k, "impl": "box_fused", "threads": threads, "run": run}
            row.update(strip=strip, batch=batch, tile_w=geo["tile_w"], kernel_us=us)
            results["box"].append(row)
            print(
                f"k={k} threads {threads} run {run} strip {strip} batch {batch} "
                f"tile {geo['tile_w']}: {us:.1f} us"
            )
            if k not in best or us < best[k]["kernel_us"]:
                best[k] = row
    print("best per k:", json.dumps(best))
    results["best"] = best

    for size, (h, w) in sizes.items():
        if size not in args.sizes.split(","):
            continue
        big = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        d_big, d_bout = cuda.to_device(big), cuda.device_array(big.shape, np.uint8)
        for k in (3, 21, 101):
            anchor = (k // 2, k // 2)
            us = timer.kernel_us(
                lambda i=d_big, o=d_bout, k=k, a=anchor: kbox.box_auto(i, (k, k), a, 0, 0, o)
            )
            results["box"].append({"k": k, "impl": "box_auto", "size": size, "kernel_us": us})
            print(f"{size} k={k} box_auto (default geometry) {us:.1f} us")
        gray = np.ascontiguousarray(big[:, :, 1]).reshape(h, w, 1)
        d_gray, d_edges = cuda.to_device(gray), cuda.device_array((h, w), np.uint8)
        us = timer.kernel_us(lambda i=d_gray, o=d_edges: kcontour.contour(i, 0, 0, o))
        floor = 2 * gray.nbytes / (bandwidth * 1e3)
        results["contour"].append({"size": size, "kernel_us": us, "floor_us": floor})
        print(f"{size} contour gray {us:.1f} us (floor {floor:.1f} us)")
        d_cout = cuda.device_array((h, w), np.uint8)
        us = timer.kernel_us(lambda i=d_big, o=d_cout: kcontour.contour(i, 0, 0, o))
        results["contour"].append({"size": size, "channels": 3, "kernel_us": us})
        print(f"{size} contour bgr {us:.1f} us")

    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
