"""Geometry sweep of the uint8 box kernel on a batch in one launch (GPU and CuPy needed).

A batch of --n frames (default 32 720p RGB uint8), box --k: `kernels.box.tiled` at its
default geometry and at a few others, each run for the whole batch as one launch
(`kernels.common.launch.Batching`); kernel time from spin-queued CUDA events (median of three
windows of 20 launches), every output compared with the default's, the default's
first and last frames with cv2.blur. Then the single-image kernel against its batched
form at N=1 (what the batched body costs). Prints one line per geometry; --json FILE
keeps them.

    python benchmarks/sweep_batch.py [--k 5] [--n 32] [--json sweep.json]
    ncu -k regex:batched --launch-skip 1 --launch-count 1 python benchmarks/sweep_batch.py --profile
"""

from __future__ import annotations

import argparse
import json

import numpy as np

GEOMETRIES = [  # (threads, run, tile_w, tile_h, groups, min_blocks)
    (256, 16, 64, 32, 2, 0), (256, 16, 64, 16, 2, 0), (256, 16, 64, 64, 2, 0),
    (256, 8, 64, 32, 2, 0), (512, 16, 128, 32, 4, 0), (256, 16, 64, 32, 4, 0),
    (256, 16, 64, 32, 1, 0), (128, 16, 32, 32, 2, 0), (256, 16, 64, 32, 2, 2),
    (256, 16, 64, 32, 2, 4), (256, 16, 64, 32, 2, 5), (256, 16, 64, 32, 2, 6),
    (256, 16, 64, 32, 4, 2), (256, 16, 64, 32, 4, 5), (256, 16, 64, 64, 4, 2),
    (512, 16, 128, 64, 4, 0), (512, 16, 128, 32, 4, 2), (256, 32, 64, 32, 2, 0),
]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--json")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="only launch the default geometry twice (for ncu --launch-skip 1)",
    )
    args = ap.parse_args()
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no CuPy, no driver, no device
        raise SystemExit(f"sweep_batch needs CuPy and an NVIDIA GPU: {exc}") from None
    import cv2

    from imgfilter.border import border_code
    from kernels.box import plan as box_plan
    from kernels.box import tiled as box_tiled
    from kernels.common.devarray import as_device_array
    from kernels.common.launch import Batching
    from kernels.common.timing import busy

    n, k, shape = args.n, args.k, (720, 1280, 3)
    batch = cp.asarray(np.random.default_rng(0).integers(0, 256, (n, *shape), dtype=np.uint8))
    stream = cp.cuda.Stream(non_blocking=True)
    src = as_device_array(batch)
    mode, anchor = border_code("reflect101"), (k // 2, k // 2)

    def run(geo, out, images: int = n) -> None:
        dst = as_device_array(out)
        if images == 0:  # the single-image kernel, no batching
            box_tiled.box_tiled(src[0], (k, k), anchor, mode, 0, dst[0], geo, stream.ptr)
            return
        firsts = ((src[0], src.strides[0]), (dst[0], dst.strides[0]))
        with Batching(images, firsts):
            box_tiled.box_tiled(src[0], (k, k), anchor, mode, 0, dst[0], geo, stream.ptr)

    def kernel_us(fn, reps: int = 20) -> float:
        fn()
        stream.synchronize()
        start, end, windows = cp.cuda.Event(), cp.cuda.Event(), []
        for _ in range(3):
            busy(0.006, stream.ptr)
            start.record(stream)
            for _ in range(reps):
                fn()
            end.record(stream)
            end.synchronize()
            windows.append(cp.cuda.get_elapsed_time(start, end) * 1000 / reps)
        return float(np.median(windows))

    default = box_plan.tiled_plan(shape, np.uint8, (k, k))
    reference = cp.empty_like(batch)
    run(default, reference)
    if args.profile:
        run(default, reference)
        stream.synchronize()
        return
    rows = []
    for g in [None, *GEOMETRIES]:
        names = ("threads", "run", "tile_w", "tile_h", "groups", "min_blocks")
        options = {} if g is None else dict(zip(names, g, strict=True))
        geo = default if g is None else box_plan.tiled_plan(shape, np.uint8, (k, k), **options)
        if geo is None:
            rows.append({"geometry": options, "skipped": "the plan declines it"})
            continue
        out = cp.empty_like(batch)
        us = kernel_us(lambda geo=geo, out=out: run(geo, out))
        same = bool(cp.array_equal(out, reference))
        rows.append({"geometry": options or "default", "batch_us": us, "per_image_us": us / n,
                     "equal_default": same})  # fmt: skip
        print(rows[-1], flush=True)
    out = cp.empty_like(batch)
    single = {"single_image_kernel_us": kernel_us(lambda: run(default, out, 0)),
              "batched_form_n1_us": kernel_us(lambda: run(default, out, 1))}  # fmt: skip
    print(single)
    host, got = cp.asnumpy(batch[[0, n - 1]]), cp.asnumpy(reference[[0, n - 1]])
    cv2_ok = all(np.array_equal(cv2.blur(host[i], (k, k)), got[i]) for i in range(2))
    print({"default_equals_cv2_first_last": cv2_ok})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"k": k, "n": n, "rows": rows, **single, "cv2_ok": cv2_ok}, f, indent=1)


if __name__ == "__main__":
    main()
