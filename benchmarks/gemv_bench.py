"""GEMV on the GPU: every kernels.linalg.gemv method, the autotuned one, and torch.mv (cuBLAS).

For each (N, K) and dtype: autotune (kernels.linalg.gemv.autotune, verified against float64
NumPy, cached) then, per method, the kernel time per launch from launches queued
behind a spin kernel (bench.py's Timer, CUDA events; Numba's Python launch cost
excluded), the effective bandwidth (bytes of A / kernel time) and its share of the
device-to-device copy bandwidth measured in the same run. Per-call times (synchronised
wall time of one Python call on device arrays) and enqueue times (Python cost of a
call, no synchronisation) are reported for `gemv(method="auto", out=...)` on
kernels.common.devarray.DeviceArray views of the device arrays, for a
pre-built Numba launch of the same kernel, and for torch.mv. "queued" is issue 23's
pipeline figure: the wall time of 1000 calls queued back to back on device inputs
(`gemv(dA, dx)` on kernels.common.devarray.DeviceArray views, `torch.mv(tA, tx)`: each call
allocates its result), divided by 1000, the best of 3 runs: the host cost of a call
where the kernel is shorter, the kernel time where it is longer.

    python benchmarks/gemv_bench.py --json out/gemv.json --txt out/gemv.txt --plot out/gemv.png
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

from kernels.common.arrays import as_device_array  # noqa: E402
from kernels.common.refs import dispatcher_of  # noqa: E402
from kernels.linalg import gemv as G  # noqa: E402

SIZES = [(1024, 1024), (4096, 4096), (16384, 16384), (8192, 28672)]
DTYPES = {"float16": np.float16, "float32": np.float32}
METHODS = ["naive", "splitk", "vectorized", "tree"]


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def enqueue_us(fn, calls: int = 50) -> float:
    """Median Python wall microseconds of fn() without synchronising (launch cost)."""
    from numba import cuda

    fn()
    cuda.synchronize()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    cuda.synchronize()
    return float(np.median(times) * 1e6)


def queued_us(fn, calls: int = 1000, repeats: int = 3) -> float:
    """Wall microseconds per call of `calls` calls of fn() queued back to back (no
    synchronisation between them; the device is idle before each run), best of
    `repeats`."""
    from numba import cuda

    fn()
    cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
        cuda.synchronize()
    return best * 1e6


def run(sizes, dtypes, launches: int, methods: list[str], tune_launches: int = 10) -> dict:
    from numba import cuda

    timer = Timer(repeats=5)
    copy_gbs = copy_bandwidth_gbs(timer)
    torch = _torch()
    rows = []
    tuning = []
    rng = np.random.default_rng(0)
    for dname in dtypes:
        dtype = DTYPES[dname]
        for n, k in sizes:
            A = (rng.random((n, k), dtype=np.float32) * 2 - 1).astype(dtype)
            x = (rng.random(k, dtype=np.float32) * 2 - 1).astype(dtype)
            t0 = time.perf_counter()
            tuned = G.autotune(n, k, dtype, data=(A, x), launches=tune_launches)
            tune_s = time.perf_counter() - t0
            print(
                f"autotune {dname} {n}x{k}: {len(tuned['tried'])} candidates in {tune_s:.1f} s, "
                f"best {tuned['method']} {_cfg(tuned['config'])} {tuned['kernel_us']} us",
                flush=True,
            )
            tuning.append(dict(dtype=dname, n=n, k=k, seconds=round(tune_s, 1), **tuned))
            ref, scale = G._reference(A, x)
            dA, dx = cuda.to_device(A), cuda.to_device(x)
            del A
            dy = cuda.device_array(n, dtype=dtype)
            nbytes = n * k * np.dtype(dtype).itemsize

            def record(impl, k_us, dname=dname, n=n, k=k, nbytes=nbytes, **extra):
                gbs = nbytes / (k_us * 1e-6) / 1e9
                rows.append(
                    dict(
                        dtype=dname,
                        n=n,
                        k=k,
                        impl=impl,
                        kernel_us=round(k_us, 2),
                        gbs=round(gbs, 1),
                        pct_copy=round(100 * gbs / copy_gbs, 1),
                        **extra,
                    )
                )
                print(_line(rows[-1]), flush=True)  # partial results survive a time limit

            for method in [*methods, "auto"]:
                how, kernel = G.plan(n, k, dtype, method=method)
                cfg = dispatcher_of(kernel)[how.grid, how.block]  # Numba's own launch
                cfg(dA, dx, dy)
                ok = G.within_tolerance(dy.copy_to_host(), ref, scale, dtype)
                slow = method == "naive" and nbytes > (64 << 20)
                k_us = timer.kernel_us(
                    lambda c=cfg, a=dA, b=dx, y=dy: c(a, b, y), 3 if slow else launches
                )
                extra = dict(ok=ok, method=how.method, config=vars(how.config), pack=how.pack)
                if method == "auto":
                    # DeviceArray views: what the package's calls return (a Numba
                    # array's interface dict costs ~10 us per array per call).
                    vA, vx, vy = as_device_array(dA), as_device_array(dx), as_device_array(dy)

                    def call(a=vA, b=vx, c=vy):
                        G.gemv(a, b, out=c)

                    extra.update(
                        queued_us=round(queued_us(lambda a=vA, b=vx: G.gemv(a, b)), 2),
                        call_us=round(timer.call_us(call, 20), 1),
                        enqueue_us=round(enqueue_us(call), 1),
                        launch_call_us=round(
                            timer.call_us(lambda c=cfg, a=dA, b=dx, y=dy: c(a, b, y), 20), 1
                        ),
                        launch_enqueue_us=round(
                            enqueue_us(lambda c=cfg, a=dA, b=dx, y=dy: c(a, b, y)), 1
                        ),
                    )
                record(method, k_us, **extra)
            if torch is not None:
                tA = torch.as_tensor(dA, device="cuda")
                tx = torch.as_tensor(dx, device="cuda")
                ty = torch.empty(n, dtype=tA.dtype, device="cuda")

                def tmv(a=tA, b=tx, c=ty):
                    torch.mv(a, b, out=c)

                k_us = timer.kernel_us(tmv, launches)
                got = ty.cpu().numpy()
                record(
                    "torch.mv",
                    k_us,
                    ok=G.within_tolerance(got, ref, scale, dtype),
                    call_us=round(timer.call_us(tmv, 20), 1),
                    enqueue_us=round(enqueue_us(tmv), 1),
                    queued_us=round(queued_us(lambda a=tA, b=tx: torch.mv(a, b)), 2),
                )
                del tA, tx, ty
            cuda.synchronize()
    dev = cuda.get_current_device()
    return dict(
        when=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        device=G.gpu_name(),
        sms=int(dev.MULTIPROCESSOR_COUNT),
        python=platform.python_version(),
        torch=None if torch is None else torch.__version__,
        torch_note="" if torch is not None else "torch not importable: no torch.mv rows",
        copy_gbs=round(copy_gbs, 1),
        rows=rows,
        tuning=tuning,
    )


def _cfg(c: dict | None) -> str:
    if not c:
        return ""
    return f"bn{c['block_n']} rt{c['reduce_threads']} u{c['unroll']} v{c['vec_bytes']}"


def _line(r: dict) -> str:
    call = f"{r['call_us']:.1f}" if "call_us" in r else "-"
    enq = f"{r['enqueue_us']:.1f}" if "enqueue_us" in r else "-"
    queued = f"{r['queued_us']:.1f}" if "queued_us" in r else "-"
    cfg = "" if r["impl"] == "torch.mv" else f"{r['method']} {_cfg(r.get('config'))}"
    flag = "" if r.get("ok", True) else "  WRONG RESULT"
    return (
        f"{r['dtype']:8} {str(r['n']) + 'x' + str(r['k']):>12} {r['impl']:10} "
        f"{r['kernel_us']:>10.2f} {r['gbs']:>7.0f} {r['pct_copy']:>6.1f} {call:>8} "
        f"{enq:>7} {queued:>7}  {cfg}{flag}"
    )


def table(result: dict) -> str:
    head = (
        f"{'dtype':8} {'N x K':>12} {'impl':10} {'kernel us':>10} {'GB/s':>7} {'% copy':>6} "
        f"{'call us':>8} {'enq us':>7} {'queued':>7}  config"
    )
    lines = [
        f"GEMV y = A @ x, {result['device']}, copy bandwidth {result['copy_gbs']} GB/s "
        f"(read + write), {result['when']}",
        "kernel us: launches queued behind a spin kernel (CUDA events); call us: one "
        "synchronised Python call; enq us: Python cost of a call (no sync); queued: "
        "wall time per call of 1000 calls queued on device inputs (no out=)",
        head,
        "-" * len(head),
    ]
    lines += [_line(r) for r in result["rows"]]
    lines.append("")
    lines.append("auto = the autotuned entry; a pre-built Numba launch of the same kernel:")
    for r in result["rows"]:
        if r["impl"] == "auto":
            lines.append(
                f"  {r['dtype']} {r['n']}x{r['k']}: launch call {r['launch_call_us']} us, "
                f"launch enqueue {r['launch_enqueue_us']} us; gemv() call {r['call_us']} us, "
                f"enqueue {r['enqueue_us']} us"
            )
    lines.append("")
    lines.append("autotune (tried candidates; 128-bit vs 64-bit loads at bn4 rt32 u2):")
    for t in result["tuning"]:
        v16 = v8 = None
        for c in t["tried"]:
            if c["method"] == "tree" and c["config"]["block_n"] == 4:
                if c["config"]["reduce_threads"] == 32 and c["config"]["unroll"] == 2:
                    if c["config"]["vec_bytes"] == 16:
                        v16 = c.get("kernel_us")
                    elif c["config"]["vec_bytes"] == 8:
                        v8 = c.get("kernel_us")
        bad = sum(not c["ok"] for c in t["tried"])
        lines.append(
            f"  {t['dtype']} {t['n']}x{t['k']}: {len(t['tried'])} candidates ({bad} rejected) "
            f"in {t['seconds']} s; best {t['method']} {_cfg(t['config'])} {t['kernel_us']} us; "
            f"16-byte loads {v16} us vs 8-byte {v8} us"
        )
    if result["torch_note"]:
        lines.append(result["torch_note"])
    return "\n".join(lines)


def _area(label: str) -> int:
    n, k = label.split("x")
    return int(n) * int(k)


def plot(result: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not importable: no plot"
    dnames = [d for d in DTYPES if any(r["dtype"] == d for r in result["rows"])]
    fig, axes = plt.subplots(1, len(dnames), figsize=(6 * len(dnames), 4.5), squeeze=False)
    axes = axes[0]
    for ax, dname in zip(axes, dnames, strict=True):
        rows = [r for r in result["rows"] if r["dtype"] == dname]
        labels = sorted({f"{r['n']}x{r['k']}" for r in rows}, key=_area)
        for impl, style in [("auto", "o-"), ("torch.mv", "s--"), ("tree", "^:"), ("splitk", "v:")]:
            pts = {f"{r['n']}x{r['k']}": r["gbs"] for r in rows if r["impl"] == impl}
            ax.plot(range(len(labels)), [pts.get(s, np.nan) for s in labels], style, label=impl)
        ax.axhline(result["copy_gbs"], color="gray", lw=0.8, label="copy")
        ax.axhline(0.9 * result["copy_gbs"], color="gray", ls=":", lw=0.8, label="90% copy")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("N x K")
        ax.set_title(f"GEMV {dname}")
        ax.legend()
    axes[0].set_ylabel("effective GB/s (bytes of A / kernel time)")
    fig.suptitle(result["device"])
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="*", default=[f"{n}x{k}" for n, k in SIZES])
    ap.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--methods", nargs="*", default=METHODS, choices=METHODS)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--tune-launches", type=int, default=10, help="launches per autotune timing")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--txt", help="write the table here")
    ap.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    args = ap.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes]
    t0 = time.perf_counter()
    result = run(sizes, args.dtypes, args.launches, args.methods, args.tune_launches)
    result["bench_seconds"] = round(time.perf_counter() - t0, 1)
    text = table(result)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.txt:
        Path(args.txt).parent.mkdir(parents=True, exist_ok=True)
        Path(args.txt).write_text(text + "\n")
    if args.plot:
        note = plot(result, args.plot)
        if note:
            print(note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
