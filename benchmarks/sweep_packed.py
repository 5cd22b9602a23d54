"""Geometry sweep of the packed box kernel next to the one-pass box kernel (GPU only).

For k in 3, 21, 101 on a random uint8 RGB image of the seed's size, times
`kernels.box_packed` over threads x strip x batch and `kernels.box_fused` at its
default geometry (kernel time, spin-queued events as in `imgfilter.bench`), checks
that both give identical images, and prints the best geometry per k; then times both
defaults on 4K and 8K images, and CuPy's uniform_filter where CuPy is installed.

    python benchmarks/sweep_packed.py --json sweep.json [--quick]
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
    parser.add_argument("--quick", action="store_true", help="default geometries only")
    args = parser.parse_args(argv)

    from numba import cuda

    from imgfilter.bench import Timer, copy_bandwidth_gbs
    from kernels import box_fused as kfused
    from kernels import box_packed as kpacked
    from kernels import box_plan

    timer = Timer()
    bandwidth = copy_bandwidth_gbs(timer)
    sizes = {"seed": (2167, 2495), "4k": (2160, 3840), "8k": (4320, 7680)}
    rng = np.random.default_rng(0)
    print(f"device {cuda.get_current_device().name}, copy bandwidth {bandwidth:.0f} GB/s")
    results: dict = {"copy_bandwidth_GBps": bandwidth, "rows": [], "mismatches": []}

    def run_case(size: str, k: int, geometries) -> None:
        h, w = sizes[size]
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        d_img = cuda.to_device(img)
        d_ref, d_out = cuda.device_array_like(d_img), cuda.device_array_like(d_img)
        floor = 2 * img.nbytes / (bandwidth * 1e3)
        a = (k // 2, k // 2)
        kfused.box_fused(d_img, (k, k), a, 0, 0, d_ref)
        ref = d_ref.copy_to_host()
        us = timer.kernel_us(lambda: kfused.box_fused(d_img, (k, k), a, 0, 0, d_ref))
        results["rows"].append({"size": size, "k": k, "impl": "box_fused", "kernel_us": us})
        print(f"{size} k={k} box_fused {us:.1f} us (floor {floor:.1f} us)")
        for threads, strip, batch in geometries:
            geo = box_plan.packed_plan(img.shape, img.dtype, (k, k), threads, 0, strip, batch)
            if geo is None:
                continue
            kpacked.box_packed(d_img, (k, k), a, 0, 0, d_out, geo)
            if not np.array_equal(d_out.copy_to_host(), ref):
                results["mismatches"].append({"size": size, "k": k, "geo": str(geo)})
                print(f"MISMATCH {size} k={k} {geo}")
            us = timer.kernel_us(lambda g=geo: kpacked.box_packed(d_img, (k, k), a, 0, 0, d_out, g))
            row = {"size": size, "k": k, "impl": "box_packed", "kernel_us": us}
            row.update(threads=geo["threads"], strip=geo["strip"], batch=geo["batch"])
            row.update(tile_w=geo["tile_w"], floor_us=floor)
            results["rows"].append(row)
            print(
                f"{size} k={k} box_packed threads {geo['threads']} strip {geo['strip']} "
                f"batch {geo['batch']} tile {geo['tile_w']}: {us:.1f} us"
            )
        try:
            import cupy
            from cupyx.scipy import ndimage

            c_img = cupy.asarray(img)
            c_out = cupy.empty_like(c_img)
            us = timer.kernel_us(
                lambda: ndimage.uniform_filter(c_img, (k, k, 1), output=c_out, mode="mirror"),
                launches=3,
            )
            results["rows"].append({"size": size, "k": k, "impl": "cupy", "kernel_us": us})
            print(f"{size} k={k} cupy uniform_filter {us:.1f} us")
        except ImportError:
            pass

    default = [(0, 0, 0)]
    space = (
        default
        if args.quick
        else default + list(itertools.product((64, 128, 256), (16, 24, 32, 48), (8,)))
    )
    for k in (3, 21, 101):
        run_case("seed", k, space)
    for size in ("4k", "8k"):
        for k in (3, 21, 101):
            run_case(size, k, default)
    best: dict = {}
    for row in results["rows"]:
        if row["impl"] == "box_packed" and row["size"] == "seed":
            if row["k"] not in best or row["kernel_us"] < best[row["k"]]["kernel_us"]:
                best[row["k"]] = row
    print("best per k:", json.dumps(best))
    results["best"] = best
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 1 if results["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
