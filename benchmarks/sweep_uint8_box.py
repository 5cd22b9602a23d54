"""Geometry sweep of a uint8 box kernel next to the one-pass box kernel (GPU only).

For k in --ks (default 3, 21, 101) on a random uint8 RGB image of the seed's size,
times `kernels.box.tiled` (--kernel tiled, the default), `kernels.box.packed`
(--kernel packed) or `kernels.box.twopass` (--kernel twopass) over its geometry
grid and `kernels.box.fused` at its default geometry (kernel time, spin-queued
events as in `imgfilter.bench`), checks that both give identical images, and
prints the best geometry per k; then times both defaults on the --sizes images
(4K, 8K), and CuPy's uniform_filter where CuPy is installed. Registers and local
memory per thread of each compiled specialisation go into the JSON. Exits 1 if any
geometry disagreed with box_fused.

    python benchmarks/sweep_uint8_box.py --json sweep.json [--quick] [--kernel packed]
    python benchmarks/sweep_uint8_box.py --kernel twopass --ks 41,61,101,151
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import numpy as np

SIZES = {"seed": (2167, 2495), "4k": (2160, 3840), "8k": (4320, 7680)}


# Tiles for boxes too tall for the default shared-memory budget (--grid large): up to
# an H100's 227 KiB per block.
LARGE = [
    dict(threads=t, tile_w=w, tile_h=h, groups=g, smem_limit=227 * 1024)
    for t, w, h, g in [(512, 128, 32, 4), (512, 128, 64, 4), (1024, 256, 32, 8),
                       (512, 64, 64, 4), (1024, 128, 96, 8)]
]  # fmt: skip


def _grid(kernel: str) -> list[dict]:
    """The geometries swept (keyword arguments of the kernel's plan function)."""
    if kernel == "packed":
        return [
            dict(threads=t, strip=s, batch=8)
            for t, s in itertools.product((64, 128, 256), (16, 24, 32, 48))
        ]
    if kernel == "twopass":  # row pass runs and threads; column pass groups x words x rows
        return [
            dict(col_groups=0, col_threads=256, strip=32),
            dict(col_groups=8, col_threads=32, strip=256),
            dict(run=20),
            dict(run=28),
            dict(run=44),
            dict(run=52),
            dict(row_threads=128),
            dict(col_groups=8, col_threads=32, strip=192),
            dict(col_groups=8, col_threads=32, strip=320),
        ]
    return [
        dict(groups=2),
        dict(groups=8),
        dict(min_blocks=8),
        dict(run=8),
        dict(run=32),
        dict(tile_h=48),
        dict(tile_h=24),
        dict(threads=128, tile_h=16, groups=2),
        dict(threads=512, tile_w=128, tile_h=32),
        dict(threads=512, tile_h=64, min_blocks=4),
        dict(min_blocks=2),
        dict(min_blocks=6),
        dict(groups=4, min_blocks=2),
        dict(groups=4, min_blocks=6),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="default geometries only")
    parser.add_argument("--kernel", choices=("tiled", "packed", "twopass"), default="tiled")
    parser.add_argument("--sizes", default="4k,8k", help="sizes timed at the defaults")
    parser.add_argument("--ks", default="3,21,101", help="box sizes")
    parser.add_argument("--grid", choices=("default", "large"), default="default",
                        help="large: tiles for tall boxes (LARGE)")  # fmt: skip
    args = parser.parse_args(argv)

    from numba import cuda

    from imgfilter.bench import Timer, copy_bandwidth_gbs
    from kernels.box import fused as kfused
    from kernels.box import packed as kpacked
    from kernels.box import plan as box_plan
    from kernels.box import tiled as ktiled
    from kernels.box import twopass as ktwopass

    name = f"box_{args.kernel}"
    if args.kernel == "packed":
        make_plan, launch, compiled = box_plan.packed_plan, kpacked.box_packed, kpacked._KERNELS
    elif args.kernel == "twopass":
        make_plan, launch, compiled = box_plan.twopass_plan, ktwopass.box_twopass, {}
    else:
        make_plan, launch, compiled = box_plan.tiled_plan, ktiled.box_tiled, ktiled._KERNELS

    timer = Timer()
    bandwidth = copy_bandwidth_gbs(timer)
    rng = np.random.default_rng(0)
    print(f"device {cuda.get_current_device().name}, copy bandwidth {bandwidth:.0f} GB/s")
    results: dict = {"copy_bandwidth_GBps": bandwidth, "rows": [], "mismatches": []}

    def run_case(size: str, k: int, geometries: list[dict]) -> None:
        h, w = SIZES[size]
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
        if args.kernel == "twopass":  # each pass alone, default geometry
            geo = make_plan(img.shape, img.dtype, (k, k))
            sums = ktwopass.row_pass(d_img, (k, k), a, 0, 0, geo)
            row_us = timer.kernel_us(lambda: ktwopass.row_pass(d_img, (k, k), a, 0, 0, geo))
            col_us = timer.kernel_us(
                lambda: ktwopass.column_pass(sums, (k, k), a, 0, 0, geo, d_out)
            )
            results["rows"].append(
                {"size": size, "k": k, "impl": "passes", "row_us": row_us, "col_us": col_us}
            )
            print(f"{size} k={k} row pass {row_us:.1f} us, column pass {col_us:.1f} us")
        for kwargs in geometries:
            geo = make_plan(img.shape, img.dtype, (k, k), **kwargs)
            if geo is None:
                continue
            launch(d_img, (k, k), a, 0, 0, d_out, geo)
            if not np.array_equal(d_out.copy_to_host(), ref):
                results["mismatches"].append({"size": size, "k": k, "geo": str(geo)})
                print(f"MISMATCH {size} k={k} {geo}")
            us = timer.kernel_us(lambda g=geo: launch(d_img, (k, k), a, 0, 0, d_out, g))
            hidden = ("grid", "even", "sum_type", "row_grid", "col_grid", "row_smem", "pitch16")
            shown = {key: v for key, v in geo.items() if key not in hidden}
            results["rows"].append(
                {"size": size, "k": k, "impl": name, "kernel_us": us, "floor_us": floor, **shown}
            )
            print(f"{size} k={k} {name} {shown}: {us:.1f} us")
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

    default = [{}]
    space = default if args.quick else default + _grid(args.kernel)
    if args.grid == "large":
        space = LARGE
    ks = [int(k) for k in args.ks.split(",")]
    for k in ks:
        run_case("seed", k, space)
    at_sizes = default if args.quick or args.kernel != "tiled" else default + [
        dict(threads=512, tile_h=64, min_blocks=4),
        dict(threads=512, tile_w=128, tile_h=32),
        dict(tile_h=48),
    ]  # fmt: skip
    for size in filter(None, args.sizes.split(",")):
        for k in ks:
            run_case(size, k, at_sizes)
    if args.kernel == "twopass":
        compiled = {("row", c): k for c, k in ktwopass._ROW_SUMS.items()}
        compiled["column"] = ktwopass.box_column_means
    results["registers"] = {
        str(key): {
            "regs": str(kern.get_regs_per_thread()),
            "local": str(kern.get_local_mem_per_thread()),
        }
        for key, kern in compiled.items()
    }
    print("registers / local memory per thread:", json.dumps(results["registers"]))
    best: dict = {}
    for row in results["rows"]:
        if row["impl"] == name and row["size"] == "seed":
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
