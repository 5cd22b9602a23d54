"""Softmax bandwidth on the GPU: every path of kernels.softmax next to torch.softmax.

For each width and dtype, a (2**26 / cols, cols) array (2**26 elements by default):
kernel time per launch from launches queued behind a spin kernel (bench.py's
Timer, CUDA events), per-call time of the public `kernels.softmax.softmax` on device
arrays (the pipeline view: wall time of --calls calls queued back to back, output
allocated by each call, then one synchronisation, divided by --calls; torch.softmax
measured the same way), effective bandwidth = bytes read + written once / kernel
time, and its share of the device-to-device copy bandwidth measured in the same run.
A second table gives the same per-call times on small inputs (--small, default 1 x
1024 and 4096 x 1024), where the host's cost per call shows. The path `auto` chooses
is marked. The split path (a row over several blocks) runs at every block width;
where auto picks it (rows wider than one block's shared memory) also with other
chunk counts and block sizes (SPLIT_SWEEP), and float16 rows up to 1024 columns also
run the warp path with 8-byte packs (the 1000-column case sits at the 90% line with
16-byte ones).

    python benchmarks/softmax_bench.py --json out/softmax.json --plot out/softmax.png
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import Timer, copy_bandwidth_gbs  # noqa: E402

from kernels.common import arrays  # noqa: E402
from kernels.softmax import dispatch as sm  # noqa: E402

WIDTHS = [32, 128, 512, 1000, 1024, 2048, 4096, 8192, 32768, 131072]
DTYPES = {"float32": np.float32, "float16": np.float16}
# --variants: split's chunks per row and block sizes where auto picks split.
SPLIT_SWEEP = [dict(chunks=c) for c in (4, 8, 16, 32, 64)] + [
    dict(block_size=b) for b in (128, 256, 512, 1024)
]


SMALL = [(1, 1024), (4096, 1024)]


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def percall_us(fn, calls: int) -> float:
    """Wall microseconds per call of `calls` calls of fn queued back to back, then
    one synchronisation (after a warm-up call): what a caller's loop pays per call,
    the larger of the host's cost and the GPU's."""
    from numba import cuda

    fn()
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def run(
    elements: int,
    widths: list[int],
    dtypes: list[str],
    launches: int,
    variants: bool = False,
    calls: int = 1000,
    small: list[tuple[int, int]] = SMALL,
) -> dict:
    from numba import cuda

    timer = Timer(repeats=5)
    copy_gbs = copy_bandwidth_gbs(timer)
    torch = _torch()
    rows_out = []
    rng = np.random.default_rng(0)
    for dname in dtypes:
        dtype = DTYPES[dname]
        flat = arrays.to_device(rng.standard_normal(elements, dtype=np.float32).astype(dtype))
        for cols in widths:
            rows = elements // cols
            n = rows * cols
            dx = flat[:n].reshape(rows, cols)
            dy = arrays.empty((rows, cols), dtype)
            nbytes = 2 * n * np.dtype(dtype).itemsize
            auto_plan = sm.plan(rows, cols, dtype)[0]
            chosen = _ident(auto_plan)
            methods = [("warp", {})] if cols <= sm.WARP_MAX_COLS else []
            methods += [("block_smem", {}), ("block_uncached", {})]
            if cols > sm.WARP_MAX_COLS:
                methods += [("split", {})]
            if auto_plan.method == "split":
                methods += [("split", kw) for kw in SPLIT_SWEEP]
            if dname == "float16" and cols <= sm.WARP_MAX_COLS and not variants:
                methods += [("warp", dict(max_pack_bytes=8))]
            if variants and cols <= sm.WARP_MAX_COLS:
                methods += [("warp", dict(max_pack_bytes=8))]  # the 64-bit packs of before
            if variants and cols > sm.WARP_MAX_COLS:
                methods += [("block_smem", dict(unroll=u)) for u in sm.UNROLLS]
                methods += [("block_smem", dict(online=True, unroll=u)) for u in sm.UNROLLS]
                methods += [("block_uncached", dict(unroll=u)) for u in sm.UNROLLS]
                methods += [("block_uncached", dict(unroll=2, block_size=512))]
                methods += [("block_uncached", dict(unroll=4, blocks_per_sm=1))]
            seen = set()
            for method, kw in methods:
                try:
                    how, kernel = sm.plan(rows, cols, dtype, method=method, **kw)
                except ValueError as exc:
                    if kw:
                        continue
                    rows_out.append(dict(dtype=dname, cols=cols, impl=method, note=str(exc)))
                    continue
                ident = _ident(how)
                if ident in seen:
                    continue
                seen.add(ident)

                def launch(how=how, kernel=kernel, xv=dx, yv=dy):
                    sm.launch_plan(how, kernel, xv, yv)

                k_us = timer.kernel_us(launch, launches)
                c_us = None
                if not kw and calls:

                    def call(m=method, a=dx):
                        sm.softmax(a, method=m)

                    c_us = percall_us(call, calls)
                gbs = nbytes / (k_us * 1e-6) / 1e9
                label = method
                if how.method == "warp":
                    label += f" p{how.pack}"
                elif how.method == "split":
                    label += f" c{how.chunks} b{how.block[0]} u{how.unroll} s{how.stages}"
                else:
                    label += f" u{how.unroll}" + (" on" if how.online else "")
                    label += f" b{how.block[0]}" if kw.get("block_size") else ""
                    label += f" g{how.grid}" if kw.get("blocks_per_sm") else ""
                rows_out.append(
                    dict(
                        dtype=dname,
                        cols=cols,
                        rows=rows,
                        impl=label,
                        method=method,
                        unroll=how.unroll,
                        online=how.online,
                        chunks=how.chunks,
                        stages=how.stages,
                        auto=ident == chosen,
                        kernel_us=round(k_us, 2),
                        call_us=None if c_us is None else round(c_us, 1),
                        gbs=round(gbs, 1),
                        pct_copy=round(100 * gbs / copy_gbs, 1),
                        pack=how.pack,
                        grid=how.grid,
                        block=list(how.block),
                        smem=how.smem,
                        variant=kw,
                    )
                )
                print(_line(rows_out[-1]), flush=True)
            if torch is not None:
                tx = torch.as_tensor(dx, device="cuda")

                def tsm(tx=tx):
                    torch.softmax(tx, dim=-1)

                k_us = timer.kernel_us(tsm, launches)
                c_us = percall_us(tsm, calls) if calls else None
                gbs = nbytes / (k_us * 1e-6) / 1e9
                rows_out.append(
                    dict(
                        dtype=dname,
                        cols=cols,
                        rows=rows,
                        impl="torch.softmax",
                        kernel_us=round(k_us, 2),
                        call_us=None if c_us is None else round(c_us, 1),
                        gbs=round(gbs, 1),
                        pct_copy=round(100 * gbs / copy_gbs, 1),
                    )
                )
                print(_line(rows_out[-1]), flush=True)
            cuda.synchronize()
        del flat
    dev = cuda.get_current_device()
    return dict(
        when=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        device=dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
        python=platform.python_version(),
        torch=None if torch is None else torch.__version__,
        torch_note="" if torch is not None else "torch not importable: no torch column",
        elements=elements,
        copy_gbs=round(copy_gbs, 1),
        calls=calls,
        rows=rows_out,
        small=run_small(small, dtypes, calls or 1000, launches, timer, torch),
    )


def run_small(shapes, dtypes, calls: int, launches: int, timer, torch) -> list[dict]:
    """Per-call and kernel times on small device inputs: softmax() allocating its
    output, softmax(out=), and torch.softmax, each as `calls` queued calls."""
    out = []
    rng = np.random.default_rng(1)
    for dname in dtypes:
        dtype = DTYPES[dname]
        for rows, cols in shapes:
            x = rng.standard_normal((rows, cols), dtype=np.float32).astype(dtype)
            dx, dy = arrays.to_device(x), arrays.empty((rows, cols), dtype)
            r = dict(dtype=dname, rows=rows, cols=cols, path=sm.plan(rows, cols, dtype)[0].method)

            def alloc(dx=dx):
                sm.softmax(dx)

            def into(dx=dx, dy=dy):
                sm.softmax(dx, out=dy)

            r["kernel_us"] = round(timer.kernel_us(into, launches), 2)
            r["call_us"] = round(percall_us(alloc, calls), 2)
            r["call_out_us"] = round(percall_us(into, calls), 2)
            if torch is not None:
                tx = torch.as_tensor(dx, device="cuda")
                r["torch_kernel_us"] = round(
                    timer.kernel_us(lambda tx=tx: torch.softmax(tx, dim=-1), launches), 2
                )
                r["torch_call_us"] = round(
                    percall_us(lambda tx=tx: torch.softmax(tx, dim=-1), calls), 2
                )
            out.append(r)
            print(_small_line(r), flush=True)
    return out


def _small_line(r: dict) -> str:
    def f(key):
        return f"{r[key]:.1f}" if r.get(key) is not None else "-"

    return (
        f"{r['dtype']:8} {r['rows']:>5}x{r['cols']:<6} {r['path']:11} {f('kernel_us'):>9} "
        f"{f('call_us'):>9} {f('call_out_us'):>9} {f('torch_kernel_us'):>9} "
        f"{f('torch_call_us'):>9}"
    )


def _ident(how) -> tuple:
    """What makes two plans the same launch."""
    return (
        how.method, how.pack, how.unroll, how.online, how.block, how.grid, how.chunks,
        how.stages,
    )  # fmt: skip


def _line(r: dict) -> str:
    if "kernel_us" not in r:
        return f"{r['dtype']:8} {r['cols']:>7} {r['impl']:22} {r['note']}"
    call = f"{r['call_us']:.0f}" if r.get("call_us") else "-"
    mark = "<-" if r.get("auto") else ""
    return (
        f"{r['dtype']:8} {r['cols']:>7} {r['impl']:22} {r['kernel_us']:>10.1f} {call:>8} "
        f"{r['gbs']:>7.0f} {r['pct_copy']:>6.1f}  {mark}"
    )


def table(result: dict) -> str:
    head = (
        f"{'dtype':8} {'cols':>7} {'impl':22} {'kernel us':>10} {'call us':>8} "
        f"{'GB/s':>7} {'% copy':>6}  auto"
    )
    lines = [
        f"softmax, {result['elements']} elements, {result['device']}, "
        f"copy bandwidth {result['copy_gbs']} GB/s, {result['when']}",
        f"call us: wall time of {result.get('calls')} queued calls on device arrays / "
        "calls (softmax() allocating its output; torch.softmax the same way)",
        head,
        "-" * len(head),
    ]
    lines += [_line(r) for r in result["rows"]]
    if result.get("small"):
        small_head = (
            f"{'dtype':8} {'shape':12} {'path':11} {'kernel us':>9} {'call us':>9} "
            f"{'out= us':>9} {'torch krn':>9} {'torch call':>9}"
        )
        lines += ["", "small inputs, per call (queued calls / calls)", small_head]
        lines += ["-" * len(small_head)] + [_small_line(r) for r in result["small"]]
    if result["torch_note"]:
        lines.append(result["torch_note"])
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not importable: no plot"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, dname in zip(axes, DTYPES, strict=True):
        rows = [r for r in result["rows"] if r["dtype"] == dname and "gbs" in r]
        auto = [r for r in rows if r.get("auto")]
        ax.plot([r["cols"] for r in auto], [r["gbs"] for r in auto], "o-", label="kernels auto")
        torch_rows = [r for r in rows if r["impl"] == "torch.softmax"]
        if torch_rows:
            tcols, tgbs = [r["cols"] for r in torch_rows], [r["gbs"] for r in torch_rows]
            ax.plot(tcols, tgbs, "s--", label="torch")
        ax.axhline(result["copy_gbs"], color="gray", lw=0.8, label="copy")
        ax.axhline(0.9 * result["copy_gbs"], color="gray", ls=":", lw=0.8, label="90% copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cols")
        ax.set_title(f"softmax {dname}, {result['elements']} elements")
        ax.legend()
    axes[0].set_ylabel("effective GB/s (read + write)")
    fig.suptitle(result["device"])
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 26)
    ap.add_argument("--widths", type=int, nargs="*", default=WIDTHS)
    ap.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument(
        "--calls", type=int, default=1000, help="queued calls per per-call time (0: none)"
    )
    ap.add_argument(
        "--small",
        nargs="*",
        default=[f"{r}x{c}" for r, c in SMALL],
        help="ROWSxCOLS shapes of the small-input per-call table",
    )
    ap.add_argument(
        "--variants", action="store_true", help="block paths: every unroll, online, block size"
    )
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    small = [tuple(int(v) for v in shape.split("x")) for shape in args.small]
    result = run(
        args.elements, args.widths, args.dtypes, args.launches, args.variants, args.calls, small
    )
    result["bench_seconds"] = round(time.perf_counter() - t0, 1)
    print(table(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        note = plot(result, args.plot)
        if note:
            print(note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
