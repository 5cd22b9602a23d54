"""Sweep of the softmax `split` path's build options and geometry on the GPU.

For (2**26 / cols, cols) arrays: kernel time per launch (launches queued behind a spin
kernel, imgfilter.bench's Timer) of kernels.softmax.split over the GEOMETRIES below
(and, with --grid-per-sm, on fewer blocks than fit): chunk counts, block sizes,
unrolls, the piece cached as raw packs or element by element (`packed`), launch
bounds asking for N blocks per SM, and one or two buffers a block (`stages`; auto's
geometry first); the share of the copy bandwidth measured in the same run, and a
check of three rows against float64 NumPy as error / tolerance (the tests'
tolerances: <= 1 passes; the tests themselves are tests/test_softmax_split.py).

    python benchmarks/sweep_softmax_split.py --json out/sweep.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import importlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from imgfilter.bench import Timer, copy_bandwidth_gbs  # noqa: E402
from kernels.softmax import split as softmax_split  # noqa: E402

ss = softmax_split  # the module measured; --module swaps it (A/B of a kernel edit)

# dtype -> (chunks, block size, unroll or None for split_unroll's, packed, launch
# bounds' blocks per SM or 0, stages): auto's geometry first.
GEOMETRIES = {
    "float16": [
        (16, 256, 2, True, 6, 2), (8, 256, 2, True, 6, 1), (16, 128, 8, True, 6, 2),
        (16, 256, 2, True, 6, 2),
    ],
    "float32": [
        (32, 256, 2, False, 6, 2), (8, 512, None, False, 0, 1), (32, 256, 2, True, 6, 2),
        (32, 256, 2, False, 6, 2),
    ],
}  # fmt: skip
DTYPES = {"float32": np.float32, "float16": np.float16}


def _error_to_tolerance(y: np.ndarray, x: np.ndarray) -> float:
    """max |y - ref| / (atol + rtol * ref) with the tests' tolerances (<= 1 passes)."""
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    if y.dtype == np.float16:
        atol, rtol = 2.0**-24, 1e-3
    else:
        atol, rtol = float(np.finfo(np.float32).tiny), 1e-5
    return float(np.max(np.abs(y.astype(np.float64) - ref) / (atol + rtol * ref)))


def _measure(case: dict, label: str, how, launcher, grid: int = 0, **fields) -> dict:
    """Kernel time, bandwidth and error of one planned launch on `case`'s arrays
    (`grid` blocks instead of the plan's when given)."""
    x, dx, dy, rows, cols = (case[k] for k in ("x", "dx", "dy", "rows", "cols"))
    how = dataclasses.replace(how, grid=grid or how.grid)
    cfg = launcher[how.grid, how.block, 0, how.smem]

    def launch():
        cfg(dx, dy, rows, cols)

    k_us = case["timer"].kernel_us(launch, case["launches"])
    picked = [0, rows // 2, rows - 1]
    err = _error_to_tolerance(dy.copy_to_host()[picked], x[picked])
    gbs = case["nbytes"] / (k_us * 1e-6) / 1e9
    r = dict(
        dtype=case["dname"], cols=cols, rows=rows, kernel=label, chunks=how.chunks,
        block=how.block[0], unroll=how.unroll, grid=how.grid, smem=how.smem, **fields,
        kernel_us=round(k_us, 2), gbs=round(gbs, 1),
        pct_copy=round(100 * gbs / case["copy_gbs"], 1), error_to_tolerance=err,
    )  # fmt: skip
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    print(
        f"{case['dname']:8} {label:5} c{how.chunks:<3} b{how.block[0]:<5} u{how.unroll} "
        f"grid {how.grid:5} smem {how.smem:6} {extra} {k_us:8.1f} us "
        f"{gbs:6.0f} GB/s {r['pct_copy']:5.1f}%  err {err:.1e}",
        flush=True,
    )
    return r


def run(
    elements: int, cols: int, dtypes: list[str], launches: int,
    first: int | None = None, grids_per_sm: tuple = (0,),
) -> dict:  # fmt: skip
    from numba import cuda

    timer = Timer(repeats=5)
    copy_gbs = copy_bandwidth_gbs(timer)
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    rng = np.random.default_rng(0)
    out = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        rows = elements // cols
        x = (rng.standard_normal((rows, cols), dtype=np.float32) * 3).astype(dtype)
        case = dict(
            dname=dname, x=x, dx=cuda.to_device(x), dy=cuda.device_array((rows, cols), dtype),
            rows=rows, cols=cols, nbytes=2 * rows * cols * np.dtype(dtype).itemsize,
            timer=timer, launches=launches, copy_gbs=copy_gbs,
        )  # fmt: skip
        pack = 16 // np.dtype(dtype).itemsize
        for chunks, block, unroll, packed, per_sm, stages in GEOMETRIES[dname][:first]:
            bounds = (block, per_sm) if per_sm else None
            try:
                how, launcher = ss.plan_split(
                    rows, cols, dtype, dtype, pack, False, block_size=block, chunks=chunks,
                    unroll=unroll, packed=packed, bounds=bounds, stages=stages,
                )  # fmt: skip
            except ValueError as exc:
                print(f"{dname} split c{chunks} b{block}: {exc}", flush=True)
                continue
            for per_sm_grid in grids_per_sm:
                grid = per_sm_grid * sms
                if grid and (grid > how.grid or grid < chunks):
                    continue
                compiled = launcher.kernel.overloads[ss.signature(dtype, dtype)]
                fields = dict(
                    packed=packed, bounds=per_sm, stages=stages,
                    regs=compiled.regs_per_thread,
                    local=compiled.local_mem_per_thread,
                )  # fmt: skip
                out.append(_measure(case, "split", how, launcher, grid=grid, **fields))
    dev = cuda.get_current_device()
    return dict(
        when=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        device=dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
        elements=elements,
        copy_gbs=round(copy_gbs, 1),
        rows=out,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 26)
    ap.add_argument("--cols", type=int, default=131072)
    ap.add_argument("--dtypes", nargs="*", default=["float16", "float32"], choices=list(DTYPES))
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--first", type=int, help="only the first N geometries")
    ap.add_argument(
        "--module", action="append", default=[],
        help="also measure this copy of kernels/softmax/split.py (e.g. "
        "kernels.softmax.split_base), after the module itself",
    )  # fmt: skip
    ap.add_argument(
        "--grid-per-sm", type=int, nargs="*", default=[0],
        help="also launch the split kernel on N blocks per SM (0: as many as fit)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    global ss
    result = None
    for name in ["kernels.softmax.split", *args.module]:
        ss = importlib.import_module(name)
        print("module", name, flush=True)
        part = run(
            args.elements, args.cols, args.dtypes, args.launches, args.first,
            tuple(args.grid_per_sm),
        )  # fmt: skip
        for r in part["rows"]:
            r["module"] = name
        if result is None:
            result = part
        else:
            result["rows"] += part["rows"]
    result["sweep_seconds"] = round(time.perf_counter() - t0, 1)
    print(f"copy bandwidth {result['copy_gbs']} GB/s, {result['sweep_seconds']} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
