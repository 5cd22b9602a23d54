"""BENCHMARKS.md from the committed results, and a plot + table of one bench run.

    python benchmarks/report.py RUN.json                # one `imgfilter bench --json` run:
                                                        # writes RUN.png (needs matplotlib),
                                                        # prints its Markdown table
    python benchmarks/report.py --write BENCHMARKS.md   # regenerate the results page
    python benchmarks/report.py --check BENCHMARKS.md   # exit 1 if the page is stale

The page holds current results only: for each area, the newest committed run. Nothing
on it is typed by hand except HEADER and the short section intros below; every figure
is read from a file in benchmarks/results, named next to it.

How a new run gets on the page: commit it to benchmarks/results under the usual name,
DATE[letters]-DEVICE-WHAT.EXT (e.g. 2026-11-26r-h100-pipeline-quick.json), then run
`--write`. Names sort in time order (2026-11-26 < 2026-11-26a < ... < 2026-11-26r), so
each area simply takes the newest file by name among those matching its patterns
(AREAS below):

- image kernels: `benchmarks/bench.py --json` (or `imgfilter bench --json`) output
  (`*-bench*.json`, `*-seed.json`, `*-4k.json`, `*-8k.json`); each image size (seed,
  4k, 8k) comes from the newest file holding rows of that size, and its plot from the
  .png of the same name;
- softmax: `benchmarks/softmax_bench.py --json` (`*-softmax.json`);
- GEMV: `benchmarks/gemv_bench.py --json` (`*-gemv.json`);
- in a pipeline: `benchmarks/pipeline.py --json` (`*-pipeline*.json`); where the
  newest run lacks CV-CUDA, its figures come from the newest run that has it, with
  ours from that same run beside them;
- cold start: `benchmarks/first_use.py` output, parsed from the text
  (`*-cold-start.txt`: lines `LABEL  SECONDS s` and `first OP ...`);
- CPU backend: `benchmarks/cpu_bench.py --json` (`*-cpu-bench*.json`);
- classify: `benchmarks/classify_bench.py --json` (`*-classify.json`);
- large host images: `benchmarks/streamed_bench.py --json` (`*-streamed.json`);
- large device images: runs of `benchmarks/tall_device.py --json` gathered in one file
  (`*-tall-device.json`, `*-large-box-bands.json`: {"device", "current": the run of the
  tree as committed, "before": runs of the tree before, "runs": label -> the script's
  JSON}), the newest file;
- scale: `*-scale.json`, gathered from the results files of
  `benchmarks/many_files_cv2.py`, `imgfilter ... --gpus N` and
  `benchmarks/dask_scale.py` (each named in it): folders through the GPU pipeline
  against decoding and encoding alone, folders over 1 and 2 GPUs, Dask arrays.

tests/test_report.py regenerates the page and compares it with the committed file.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
SHAPES = {"seed": "2167x2495x3", "4k": "3840x2160x3", "8k": "7680x4320x3"}

AREAS = {
    "bench": ["*-bench*.json", "*-seed.json", "*-4k.json", "*-8k.json"],
    "softmax": ["*-softmax.json"],
    "gemv": ["*-gemv.json"],
    "pipeline": ["*-pipeline*.json"],
    "cold_start": ["*-cold-start.txt"],
    "cpu": ["*-cpu-bench*.json", "*-cpu-fft*.json"],
    "classify": ["*-classify.json"],
    "scale": ["*-scale.json"],
    "streamed": ["*-streamed.json"],
    "large_device": ["*-tall-device.json", "*-large-box-bands.json"],
}

HEADER = """\
# Benchmarks

Current results, one section per area: the newest committed run of each, with its peers
from the same run. This page is generated: `python benchmarks/report.py --write
BENCHMARKS.md` rebuilds it from `benchmarks/results/` (the script's docstring says how a
new run is picked up; `tests/test_report.py` fails if page and data disagree). What
changed when: [CHANGELOG.md](CHANGELOG.md); earlier runs are in git history.

How it measures (`benchmarks/bench.py`): **kernel us** is GPU time per launch, the
launches queued behind a spin kernel so that Python's launch cost is not counted
(CuPy and torch timed the same way); **per call** is the wall time of the public call
from Python; **x floor** is kernel time over the larger of the bytes floor (input and
output once at the copy bandwidth of the same run) and the FMA floor; a peer's
**N.Nx** is its time over ours. OpenCV runs on the host CPU (wall time). Images are
random uint8: seed 2167x2495x3, 4K 3840x2160x3, 8K 7680x4320x3; filter kernels
random full-rank float32.

```sh
python benchmarks/bench.py --sizes seed,4k,8k --json results.json   # on a GPU machine
python benchmarks/report.py results.json                            # its plot + table
```
"""


# -- finding the runs ---------------------------------------------------------------------


def _files(area: str, results: Path) -> list[Path]:
    """Files of an area, oldest first (names sort in time order)."""
    names = sorted(p.name for p in results.iterdir() if p.is_file())
    return [results / n for n in names if any(fnmatch.fnmatch(n, pat) for pat in AREAS[area])]


def _load(path: Path):
    return json.loads(path.read_text())


def _newest(area: str, results: Path) -> tuple[Path, dict] | None:
    """The newest JSON file of an area and its data, None if there is none."""
    files = _files(area, results)
    return (files[-1], _load(files[-1])) if files else None


def _run_date(path: Path) -> str:
    """The run's tag: the file name up to the device (2026-11-26q)."""
    m = re.match(r"\d{4}-\d\d-\d\d[a-z]*", path.name)
    return m.group(0) if m else path.stem


def _link(path: Path) -> str:
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return f"[`{path.name}`]({rel.as_posix()})"


def _image(png: Path, alt: str) -> list[str]:
    return [f"![{alt}]({png.relative_to(REPO).as_posix()})", ""] if png.exists() else []


def _us(t: float | None) -> str:
    if t is None:
        return ""
    return f"{t / 1000:.1f} ms" if t >= 10000 else f"{t:.1f} us"


def _x(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 100 else f"{ratio:.1f}x"


def _table(head: list[str], align: str, rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# -- image kernels (imgfilter bench --json) -------------------------------------------------


def _peer_kind(impl: str) -> str | None:
    for name in ("cupy", "torch", "opencv"):
        if impl.startswith(name):
            return name
    return None


def _bench_for_sizes(results: Path) -> dict[str, Path]:
    """size -> newest bench file with rows of that size."""
    newest: dict[str, Path] = {}
    for path in _files("bench", results):
        data = _load(path)
        if not isinstance(data, dict) or not data.get("rows") or "op" not in data["rows"][0]:
            continue
        for size in {r["size"] for r in data["rows"]}:
            if size in SHAPES:
                newest[size] = path
    return newest


def _run_line(path: Path, data: dict) -> str:
    v = data.get("versions", {})
    libs = ", ".join(f"{k} {v[k]}" for k in ("numba_cuda", "cv2", "cupy", "torch") if k in v)
    when = data["date"][:16].replace("T", " ")
    return f"Run {_link(path)}: {data['device']}, {when} UTC; {libs}."


def _kernel_rows(data: dict, size: str) -> list[list[str]]:
    """One line per case: our fastest implementation and each peer from the same run."""
    cases: dict[str, list[dict]] = defaultdict(list)
    for r in data["rows"]:
        if r["size"] == size and "rank" not in r["op"] and not r["op"].startswith("seed "):
            cases[r["op"]].append(r)
    out = []
    for op, rows in cases.items():
        ours = [r for r in rows if r["impl"].startswith("imgfilter") and r["kernel_us"]]
        if not ours:
            continue
        best = min(ours, key=lambda r: r["kernel_us"])
        t = best["kernel_us"]
        impl = best["impl"].removeprefix("imgfilter cuda").strip(" ()") or "cuda"
        peers = {}
        for r in rows:
            kind, pt = _peer_kind(r["impl"]), r["kernel_us"] or r["call_us"]
            if kind and pt:
                peers[kind] = f"{_us(pt)} ({_x(pt / t)})"
        xf = best["extra"].get("x_floor")
        out.append(
            [op, impl, f"**{t:.1f}**", _us(best["call_us"]).removesuffix(" us"),
             f"{xf:.1f}" if xf else "", peers.get("cupy", ""), peers.get("torch", ""),
             peers.get("opencv", "")]
        )  # fmt: skip
    return out


KERNEL_HEAD = ["case", "imgfilter", "kernel us", "per call us", "x floor", "CuPy", "torch",
               "OpenCV (CPU)"]  # fmt: skip
KERNEL_ALIGN = ["---", "---", "---:", "---:", "---:", "---:", "---:", "---:"]


def section_kernels(results: Path) -> list[str]:
    by_size = _bench_for_sizes(results)
    out = ["## Image kernels: box blur, filter2d, contour", ""]
    for size, title in (("seed", "Seed size"), ("4k", "4K"), ("8k", "8K")):
        path = by_size.get(size)
        if not path:
            continue
        data = _load(path)
        out += [f"### {title} ({SHAPES[size]})", "", _run_line(path, data), ""]
        out += _table(KERNEL_HEAD, KERNEL_ALIGN, _kernel_rows(data, size)) + [""]
        if size == "seed":
            out += _image(path.with_suffix(".png"), f"time vs kernel size, {path.stem}")
    out += section_low_rank(results, by_size.get("seed"))
    out += section_seed_article(results, by_size.get("seed"))
    return out


GENERIC_METHODS = ("imgfilter window", "imgfilter blocked", "imgfilter tiled", "imgfilter padded")
GENERIC_PEERS = ("torch conv2d float32", "cupy correlate float32")


def section_low_rank(results: Path, path: Path | None) -> list[str]:
    if not path:
        return []
    data = _load(path)
    cases: dict[str, dict[str, float]] = defaultdict(dict)
    for r in data["rows"]:
        if "rank" in r["op"] and r["kernel_us"]:
            cases[r["op"]][r["impl"].split()[-1]] = r["kernel_us"]
    rows = []
    for op, c in cases.items():
        if {"blocked", "separable"} <= c.keys():
            faster = "separable" if c["separable"] < c["blocked"] else "blocked"
            rows.append([op.removeprefix("filter2d "), f"{c['blocked']:.1f}",
                         f"{c['separable']:.1f}", faster])  # fmt: skip
    if not rows:
        return []
    return [
        "### Low-rank kernels (seed size)",
        "",
        "One 2-D pass (`blocked`) against r pairs of 1-D passes (`separable`), kernel us, "
        f"from {_link(path)}; `auto` chooses by `kernels.conv.plan.separable_pays`.",
        "",
        *_table(["kernel", "blocked", "separable", "faster"], ["---", "---:", "---:", "---"], rows),
        "",
    ]  # fmt: skip


def section_seed_article(results: Path, path: Path | None) -> list[str]:
    if not path:
        return []
    rows = [r for r in _load(path)["rows"] if r["op"].startswith("seed ")]
    if not rows:
        return []
    fast = min(r["kernel_us"] or r["call_us"] for r in rows if r["size"] == "seed")
    body = []
    for r in rows:
        t = r["kernel_us"] or r["call_us"]
        kind = "kernel" if r["kernel_us"] else "per call"
        ratio = _x(t / fast) if r["size"] == "seed" else ""
        body.append([r["impl"], r["size"], f"{_us(t)} ({kind})", ratio])
    return [
        "### The seed article's comparison (one 5x5 kernel)",
        "",
        f"From {_link(path)}; pure Python runs on a crop.",
        "",
        *_table(["implementation", "image", "time", "x fastest"],
                ["---", "---", "---:", "---:"], body),
        "",
    ]  # fmt: skip


# -- bench of one run: the plot and the full table --------------------------------------------


def _size_of(op: str) -> int | None:
    m = re.match(r"(?:filter2d (\d+)x\d+|blur k=(\d+))", op)
    return int(m.group(1) or m.group(2)) if m else None


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blur_sizes = [r["size"] for r in result["rows"] if r["op"].startswith("blur")]
    size = blur_sizes[0] if blur_sizes else "seed"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, prefix, title in (
        (axes[0], "filter2d", "filter2d, random k x k kernel"),
        (axes[1], "blur", "blur (box), k x k"),
    ):
        series = defaultdict(list)
        for r in result["rows"]:
            if r["size"] != size or not r["op"].startswith(prefix) or "rank" in r["op"]:
                continue  # the low-rank cases (separable vs blocked) stay in the table
            t = r["kernel_us"] or r["call_us"]
            k = _size_of(r["op"])
            if t and k and not r["impl"].endswith(("tiled", "padded", "naive")):
                # box_auto's kernel depends on k (box_tiled, box_fused): one line.
                impl = re.sub(r"\(box_\w+\)", "(box_auto)", r["impl"])
                series[impl].append((k, t / 1000.0))
        for impl, points in sorted(series.items()):
            points.sort()
            ax.plot(*zip(*points, strict=True), marker="o", label=impl)
        ax.set_yscale("log")
        ax.set_xlabel("kernel size k")
        ax.set_ylabel("time per image, ms (GPU: kernel time; CPU: wall)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{SHAPES.get(size, size)} uint8 on {result['device']}, {result['date'][:10]} "
        "(lower is better)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(result: dict) -> str:
    from imgfilter.bench import best_ours

    lines = [
        "| operation | size | implementation | kernel us | per-call us | GB/s | x floor | x ours |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    ours = best_ours(result["rows"])
    for r in result["rows"]:
        t = r["kernel_us"] or r["call_us"]
        base = ours.get((r["op"], r["size"]))

        def f(v, fmt="{:.1f}"):
            return fmt.format(v) if v is not None else ""

        lines.append(
            f"| {r['op']} | {r['size']} | {r['impl']} | {f(r['kernel_us'])} | "
            f"{f(r['call_us'])} | {f(r['extra'].get('GB/s'), '{:.0f}')} | "
            f"{f(r['extra'].get('x_floor'))} | {f(t / base if base and t else None)} |"
        )
    return "\n".join(lines)


# -- softmax, GEMV ------------------------------------------------------------------------


def section_softmax(results: Path) -> list[str]:
    files = _files("softmax", results)
    if not files:
        return []
    path = files[-1]
    data = _load(path)
    auto: dict[tuple[str, int], dict] = {}
    torch: dict[tuple[str, int], dict] = {}
    for r in data["rows"]:
        key = (r["dtype"], r["cols"])
        if r.get("auto") and "gbs" in r:
            auto.setdefault(key, r)
        elif r["impl"].startswith("torch") and "gbs" in r:
            torch[key] = r
    rows = []
    for cols in sorted({c for _, c in auto}):
        cells = [str(cols), auto.get(("float32", cols), auto.get(("float16", cols)))["method"]]
        for dtype in ("float32", "float16"):
            a, t = auto.get((dtype, cols)), torch.get((dtype, cols))
            cells += [f"{a['gbs']:.0f} ({a['pct_copy']:.1f}%)" if a else "",
                      f"{t['gbs']:.0f}" if t else ""]  # fmt: skip
        rows.append(cells)
    png = path.with_suffix(".png")
    return [
        "## Softmax",
        "",
        f"Run {_link(path)} (`benchmarks/softmax_bench.py`): {data['device']}, "
        f"{data['when'][:16].replace('T', ' ')} UTC, {data['elements']} elements per width, "
        f"copy bandwidth {data['copy_gbs']:.0f} GB/s in the same run. Effective GB/s (bytes "
        "read + written once / kernel time) of the path `auto` takes, and torch.softmax. "
        "Details: [docs/softmax.md](docs/softmax.md).",
        "",
        *_table(["cols", "auto's path", "float32 ours GB/s (% of copy)", "float32 torch",
                 "float16 ours GB/s (% of copy)", "float16 torch"],
                ["---:", "---", "---:", "---:", "---:", "---:"], rows),
        "",
        *_image(png, f"softmax, {path.stem}"),
    ]  # fmt: skip


def section_gemv(results: Path) -> list[str]:
    files = _files("gemv", results)
    if not files:
        return []
    path = files[-1]
    data = _load(path)
    auto, torch = {}, {}
    for r in data["rows"]:
        key = (r["dtype"], r["n"], r["k"])
        if r["impl"] == "auto":
            auto[key] = r
        elif r["impl"].startswith("torch"):
            torch[key] = r
    rows = []
    for key in sorted(auto, key=lambda k: (k[0] != "float32", k[1] * k[2])):
        a, t = auto[key], torch.get(key)
        rows.append(
            [key[0], f"{key[1]} x {key[2]}", f"**{a['kernel_us']:.2f}**", f"{a['gbs']:.0f}",
             f"{a['pct_copy']:.0f}", f"{t['kernel_us']:.2f}" if t else "",
             _x(t["kernel_us"] / a["kernel_us"]) if t else ""]
        )  # fmt: skip
    png = path.with_suffix(".png")
    return [
        "## GEMV and matmul",
        "",
        f"Run {_link(path)} (`benchmarks/gemv_bench.py`): {data['device']}, "
        f"{data['when'][:16].replace('T', ' ')} UTC, copy bandwidth {data['copy_gbs']:.0f} GB/s "
        "(read + write) in the same run. Kernel time of the autotuned kernel and of "
        "torch.mv (cuBLAS); GB/s = bytes of A / kernel time (A of 32 MiB or less stays in "
        "the 50 MB L2 between launches). Per-call times: the pipeline section below. "
        "Details: [docs/gemv.md](docs/gemv.md). matmul has GPU tests but no committed "
        "benchmark run.",
        "",
        *_table(["dtype", "N x K", "ours us", "GB/s", "% of copy", "torch.mv us", "torch / ours"],
                ["---", "---", "---:", "---:", "---:", "---:", "---:"], rows),
        "",
        *_image(png, f"gemv, {path.stem}"),
    ]  # fmt: skip


# -- pipeline, batches ----------------------------------------------------------------------


def _fastest(t: float, best: float) -> str:
    """`t` in us, bold where it is the row's fastest per call."""
    return f"**{t:.1f}**" if t == best else f"{t:.1f}"


def _pipeline_cases(data: dict) -> dict[str, list[dict]]:
    cases: dict[str, list[dict]] = defaultdict(list)
    for r in data["rows"]:
        cases[r["case"]].append(r)
    return cases


def _has_cvcuda(data: dict) -> bool:
    rows = data["rows"]
    return any(
        (r.get("peer") or "").startswith("cvcuda") and r.get("peer_per_call_us") for r in rows
    )


def _peer_name(peer: str) -> str:
    return {"cupy": "CuPy", "torch": "torch", "torch.mv": "torch.mv"}.get(
        peer.split()[0], peer.split()[0]
    )


def section_pipeline(results: Path) -> list[str]:
    files = _files("pipeline", results)
    if not files:
        return []
    path = files[-1]
    data = _load(path)
    cv = None
    if not _has_cvcuda(data):
        cv = next((p for p in reversed(files) if _has_cvcuda(_load(p))), None)
    cv_cases = _pipeline_cases(_load(cv)) if cv else {}
    rows = []
    for case, rs in _pipeline_cases(data).items():
        ours = rs[0]
        if not ours.get("ours_per_call_us"):
            continue
        mine = ours["ours_per_call_us"]
        best = min([mine] + [r["peer_per_call_us"] for r in rs if r.get("peer_per_call_us")])
        peers, cvcuda = [], ""
        for r in rs:
            t = r.get("peer_per_call_us")
            if not t:
                continue
            if r["peer"].startswith("cvcuda"):
                cvcuda = _fastest(t, best)
            else:
                peers.append(f"{_peer_name(r['peer'])} {_fastest(t, best)}")
        row = [case, _fastest(mine, best), f"{ours['ours_kernel_us']:.1f}", "; ".join(peers)]
        if cv:
            old = cv_cases.get(case, [])
            c = next((r for r in old if (r.get("peer") or "").startswith("cvcuda")), None)
            ok = c and c.get("peer_per_call_us")
            row += [f"{c['peer_per_call_us']:.1f}" if ok else "",
                    f"{old[0]['ours_per_call_us']:.1f}" if ok else ""]  # fmt: skip
        else:
            row.append(cvcuda)
        rows.append(row)
    h = data["header"]
    head = ["case", "ours per call us", "ours kernel us", "torch / CuPy per call us"]
    align = ["---", "---:", "---:", "---"]
    if cv:
        tag = _run_date(cv)
        head += [f"CV-CUDA per call us ({tag})", f"ours per call us ({tag})"]
        align += ["---:", "---:"]
        cv_h = _load(cv)["header"]
        cv_line = (
            f" That run had no CV-CUDA; the last two columns are the newest run with it, "
            f"{_link(cv)} ({cv_h['date_utc']}, CV-CUDA {cv_h['versions'].get('cvcuda')}, "
            f"commit {cv_h.get('git_commit')}), with ours from that run."
        )
    else:
        head.append("CV-CUDA per call us")
        align.append("---:")
        cv_line = ""
    return [
        "## In a pipeline: per-call time of queued calls",
        "",
        "`benchmarks/pipeline.py`: uint8 RGB CuPy device "
        "images, every call on one non-blocking stream, calls queued back to back. **per "
        "call** = wall time of the calls and one final synchronisation / number of calls; "
        "**kernel** = GPU time per call, queued behind a spin kernel; the fastest per "
        "call of each row is in bold. "
        f"Run {_link(path)}: {h['device']}, {h['date_utc']}, commit {h.get('git_commit')}"
        f"{' (dirty tree)' if h.get('git_dirty') else ''}"
        f"{', --quick' if h.get('quick') else ''}.{cv_line}",
        "",
        *_table(head, align, rows),
        "",
    ]


# -- first use, cold start, CPU --------------------------------------------------------------


_COLD = re.compile(r"^(\S.*?)\s{2,}(\d+\.\d+) s$")


_FIRST_CALL = re.compile(
    r"first (\w+)\s+imports\+inputs\s+([\d.]+) s\s+first call\s+([\d.]+) s\s+"
    r"total\s+([\d.]+) s.*numba imported: (\w+)"
)


def section_cold_start(results: Path) -> list[str]:
    files = _files("cold_start", results)
    if not files:
        return []
    path = files[-1]
    lines = path.read_text().splitlines()
    runs: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        m = _COLD.match(line)
        if m:
            label = re.sub(r" \(run \d+\)$", "", m.group(1))
            runs[label].append(m.group(2))
    body = [[f"`{label}`" if label.startswith("imgfilter") else label, ", ".join(ts)]
            for label, ts in runs.items()]  # fmt: skip
    first = [m.groups() for m in map(_FIRST_CALL.match, lines) if m]
    out = [
        "## Cold start: the whole command",
        "",
        f"`benchmarks/first_use.py` on the GPU host, {lines[0].lstrip('# ').strip()}: "
        f"{_link(path)} (parsed from its text). A 2167x2495 JPEG (train and classify: the "
        "512x512 sample) on a fresh kernel cache: run 1 finds only the kernels shipped in "
        "the package (or, in runs before they shipped, compiles), runs 2 and 3 come after "
        "it. Seconds, in run order:",
        "",
        *_table(["command", "wall s"], ["---", "---"], body),
        "",
    ]
    if first:
        out += [
            "The first call of each API function in a fresh process with an empty cache "
            "(`benchmarks/first_use.py --call OP`; 2167x2495x3 uint8, 21x21 kernels; softmax "
            "4096x1024 float32; GEMV 4096x4096 float16; classify 512x512):",
            "",
            *_table(
                ["call", "imports s", "first call s", "total s", "Numba imported"],
                ["---", "---:", "---:", "---:", "---"],
                [[f"`{op}`", *times] for op, *times in first],
            ),
            "",
        ]
    return out  # fmt: skip


BLUR_ROW = "imgfilter blur --k 21"


def section_cpu(results: Path) -> list[str]:
    files = _files("cpu", results)
    if not files:
        return []
    path = files[-1]
    d = _load(path)
    part = d.get("after", d)
    body = [[r["case"], f"{r['imgfilter_ms']:.1f}", f"{r['cv2_ms']:.1f}", f"{r['ratio']:.2f}",
             f"{r['max_abs_diff']:g}"] for r in part["results"]]  # fmt: skip
    return [
        "## CPU backend vs OpenCV",
        "",
        f"`benchmarks/cpu_bench.py --json`: {_link(path)}, {part['header']}. imgfilter's CPU "
        "backend and the cv2 call in one process with equal thread counts, median of warm "
        "runs; ratio = imgfilter / cv2 (below 1: imgfilter faster).",
        "",
        *_table(["case", "imgfilter ms", "cv2 ms", "ratio", "max abs diff"],
                ["---", "---:", "---:", "---:", "---:"], body),
        "",
    ]  # fmt: skip


def section_classify(results: Path) -> list[str]:
    """The classifier's stages on a 4K image beside torch (`*-classify.json` from
    benchmarks/classify_bench.py), the newest run."""
    newest = _newest("classify", results)
    if newest is None:
        return []
    path, data = newest
    stages = [[st["stage"], f"{st['us'] / 1000:.3f} ms", st["timing"],
               f"{st['% of copy']:.0f}" if "% of copy" in st else ""]
              for st in data["stages"]
              if not st["stage"].lstrip().startswith(("torch", "+", "="))]  # fmt: skip
    peers = [[name, f"{t['linear_us'] / 1000:.3f}", f"{t['softmax_us'] / 1000:.3f}",
              f"{t['argmax_us'] / 1000:.3f}", f"{t['total_us'] / 1000:.3f}"]
             for name, t in data["torch"].items()]  # fmt: skip
    summary = data["summary"]
    return [
        "## Per-pixel classification",
        "",
        f"`benchmarks/classify_bench.py` ({_link(path)}; {data['gpu']}, "
        f"{data['when'][:10]}): {data['image']}, {data['classes']} classes, "
        f"{data['features']} features + bias (a {data['feature_matrix_MB']:.0f} MB float32 "
        "feature matrix). Each stage's time: *kernel* GPU time queued behind a spin kernel, "
        "*call* a synchronised call, *wall* host wall time.",
        "",
        *_table(
            ["stage", "time", "timing", "% of copy"], ["---", "---:", "---", "---:"], stages
        ),  # fmt: skip
        "",
        "torch in the same run on the same feature matrix (kernel ms):",
        "",
        *_table(
            ["torch", "linear", "softmax", "argmax", "total"],
            ["---", "---:", "---:", "---:", "---:"],
            peers,
        ),  # fmt: skip
        "",
        f"Logits, softmax and argmax: ours {summary['ours fused us'] / 1000:.3f} ms fused, "
        f"{summary['ours gemv: logits + softmax + argmax us'] / 1000:.3f} ms through GEMV, "
        f"torch's best {summary['best torch total us'] / 1000:.3f} ms. The whole command "
        f"(read, classify, write) takes {summary['command / (read + write)']:.2f}x the time "
        "of reading the image and writing one image plane.",
        "",
    ]


def section_large_images(results: Path) -> list[str]:
    """Large host images in row bands (`*-streamed.json` from benchmarks/streamed_bench.py;
    the newest `*-host-bands.txt` is linked)."""
    newest = _newest("streamed", results)
    if newest is None:
        return []
    path, data = newest
    head = data["header"]
    n = head["size"]
    fresh = all("fresh_s" in r for r in data["rows"])  # files before it lack the column
    body = [[r["case"], f"{r['whole_s']:.3f}", f"{r['streamed_s']:.3f}",
             f"{r['streamed_x_floor']:.2f}",
             *([f"{r['fresh_s']:.3f}", f"{r['fresh_x_floor']:.2f}"] if fresh else []),
             "yes" if r["identical"] else "NO"]
            for r in data["rows"]]  # fmt: skip
    out = [
        "## Large host images",
        "",
        f"`benchmarks/streamed_bench.py` ({_link(path)}): a {n}x{n}x3 uint8 host image "
        f"({n * n * 3 / 1e9:.2f} GB), the call's default path against row bands through "
        f"a {head['budget']} budget; the PCIe floor is the image's bytes in and out at "
        f"the pinned rates measured in the run ({head['h2d_gbs']:.1f} and "
        f"{head['d2h_gbs']:.1f} GB/s): {head['floor_s']:.3f} s. Seconds, median of 3:",
        "",
        *_table(
            [
                "case",
                "default path",
                f"bands, {head['budget']} budget",
                "bands / floor",
                *(["bands, new memory", "new / floor"] if fresh else []),
                "identical",
            ],
            ["---", "---:", "---:", "---:", *(["---:", "---:"] if fresh else []), "---"],
            body,
        ),  # fmt: skip
        "",
    ]
    if fresh:
        out += [
            "Each call's result is dropped before the next: from the second call on, a "
            "result reuses the memory of the last (`imgfilter.hostmem`); *new memory*: "
            "the kept memory unmapped before each call, as in a program's first large "
            "call.",
            "",
        ]
    if head.get("note"):
        out += [head["note"], ""]
    return out


def section_large_device(results: Path) -> list[str]:
    """Large device images (`*-tall-device.json`, `*-large-box-bands.json`: runs of
    benchmarks/tall_device.py), the newest file: its current run beside the runs before."""
    newest = _newest("large_device", results)
    if newest is None:
        return []
    path, data = newest
    runs = data["runs"]
    before = defaultdict(list)
    for label in data["before"]:
        for r in runs[label]["rows"]:
            before[(r["case"], tuple(r["shape"]))].append(r["gpu_ms"])
    body = []
    for r in runs[data["current"]]["rows"]:
        old = before.get((r["case"], tuple(r["shape"])), [])
        span = "-".join(dict.fromkeys(f"{t:.1f}" for t in (min(old), max(old)))) if old else ""
        body.append([r["case"], "x".join(map(str, r["shape"])), span, f"{r['gpu_ms']:.1f}",
                     f"{r['x_floor']:.2f}", f"{r['extra_device_mb']:.0f}"])  # fmt: skip
    return [
        "## Large device images",
        "",
        f"`benchmarks/tall_device.py` ({_link(path)}, {data['device']}): uint8 CuPy images "
        "of more than 32768 rows or 2 GiB, GPU ms per call (CUDA events, median of 5); "
        "x floor: over the image's and the result's bytes at the device copy bandwidth of "
        f"the run; extra MB: device memory the call takes besides image and result. "
        f"{data['note'].capitalize()}.",
        "",
        *_table(
            ["case", "image", "before ms", "now ms", "x floor", "extra MB"],
            ["---", "---", "---:", "---:", "---:", "---:"],
            body,
        ),  # fmt: skip
        "",
    ]


def section_scale(results: Path) -> list[str]:
    """Folders through the GPU pipeline, folders over GPUs, Dask arrays over GPUs
    (`*-scale.json`: gathered from the runs' own results files, which it names)."""
    files = _files("scale", results)
    if not files:
        return []
    path = files[-1]
    data = _load(path)
    folder, gpus = data["folder_pipeline"], data["folder_on_gpus"]
    rows = []
    for threads, blocks in (("1", folder["one_filter_thread"]),
                            ("4", folder["four_filter_threads"])):  # fmt: skip
        for block in blocks:
            ips = block["images_per_s"]
            codecs, ours = (
                ips["cv2 thread pool, decode + encode only"],
                ips["imgfilter pipeline (its summary)"],
            )
            rows.append([block["op"], threads, f"{codecs:.1f}", f"{ips['cv2 thread pool']:.1f}",
                         f"{ours:.1f}", f"{ours / codecs:.2f}"])  # fmt: skip
    out = [
        "## Scale: folders and several GPUs",
        "",
        f"Gathered in {_link(path)} from the runs' own files. {folder['setup']} "
        f"([`{folder['source']}`](benchmarks/results/{folder['source']})), images/s; "
        "the two filter-thread settings ran on two hosts of the same kind, so compare "
        "within a row (issue 27 asks the pipeline for 0.9x of decoding and encoding alone):",
        "",
        *_table(
            [
                "filter",
                "GPU filter threads",
                "decode + encode only",
                "cv2 pool",
                "imgfilter pipeline",
                "pipeline / codecs",
            ],
            ["---", "---:", "---:", "---:", "---:", "---:"],
            rows,
        ),  # fmt: skip
        "",
        f"{gpus['setup']} ([`{gpus['source']}`](benchmarks/results/{gpus['source']})), "
        "images/s from the command's summary:",
        "",
    ]
    body = [[r["setting"], ", ".join(f"{v:.1f}" for v in r["gpus_1"]),
             ", ".join(f"{v:.1f}" for v in r["gpus_2"]),
             f"{sum(r['gpus_2']) / sum(r['gpus_1']):.2f}"] for r in gpus["runs"]]  # fmt: skip
    body.append(["no cluster (threaded pipeline, one GPU)",
                 ", ".join(f"{v:.1f}" for v in gpus["no_cluster"]), "", ""])  # fmt: skip
    out += _table(["--gpus workers", "1 GPU", "2 GPUs", "2 / 1"], ["---", "---", "---", "---:"],
                  body) + [""]  # fmt: skip
    dask_rows = []
    for run in data["dask_arrays"]:
        image = "x".join(str(n) for n in run["image"])
        by = {(r["op"], str(r["gpus"])): r["median_s"] for r in run["results"]}
        for op in dict.fromkeys(r["op"] for r in run["results"]):
            whole, one, two = (by.get((op, g)) for g in ("1*", "1", "2"))
            where = {"host": ", NumPy bands", "gpu": ", CuPy bands"}.get(run.get("bands_in"), "")
            whole_ms = "-" if whole is None else f"{whole * 1e3:.1f}"  # too large for one GPU
            dask_rows.append([f"{image}, {run['rows_per_band']} rows{where}", op, whole_ms,
                              f"{one * 1e3:.1f}", f"{two * 1e3:.1f}",
                              f"{one / two:.2f}"])  # fmt: skip
    cards = sorted({run["gpu"] for run in data["dask_arrays"] if run.get("gpu")})
    on = f"; GPUs: {', '.join(cards)}" if cards else ""
    sources = ", ".join(_link(results / run["source"]) for run in data["dask_arrays"])
    out += [
        "`imgfilter.dask` over dask-cuda workers, one per GPU (`benchmarks/dask_scale.py`"
        f"{on}; {sources}), median ms (NumPy bands: in the workers' host memory, each task "
        "copies its band to its GPU and back; CuPy bands: already on the GPUs; the bands in "
        "even, contiguous runs, one per worker, unless the run's file says otherwise):",
        "",
        *_table(
            [
                "image, bands",
                "op",
                "whole image, no Dask",
                "Dask, 1 GPU",
                "Dask, 2 GPUs",
                "speedup",
            ],
            ["---", "---", "---:", "---:", "---:", "---:"],
            dask_rows,
        ),  # fmt: skip
        "",
    ]
    return out


# -- the page -----------------------------------------------------------------------------


def render(results: Path = RESULTS) -> str:
    parts = [HEADER]
    for section in (
        section_kernels,
        section_softmax,
        section_gemv,
        section_pipeline,
        section_cold_start,
        section_cpu,
        section_classify,
        section_large_images,
        section_large_device,
        section_scale,
    ):
        lines = section(results)
        if lines:
            parts.append("\n".join(_wrap(lines)).rstrip("\n") + "\n")
    return "\n".join(parts)


def _wrap(lines: list[str]) -> list[str]:
    """Prose at 88 columns; tables, headings and images as they are."""
    out = []
    for line in lines:
        if len(line) <= 88 or line.startswith(("|", "#", "!")):
            out.append(line)
        else:
            out += textwrap.wrap(line, 88, break_long_words=False, break_on_hyphens=False)
    return out


USAGE = (
    "usage: python benchmarks/report.py RUN.json | --write BENCHMARKS.md | --check BENCHMARKS.md"
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] in ("--write", "--check"):
        page, target = render(), Path(args[1])
        if args[0] == "--write":
            target.write_text(page)
            return 0
        try:
            same = target.read_text() == page
        except OSError as exc:
            print(f"report: cannot read {target}: {exc.strerror or exc}", file=sys.stderr)
            return 3
        if not same:
            print(f"report: {target} is stale; run report.py --write {target}", file=sys.stderr)
        return 0 if same else 1
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        result = json.loads(path.read_text())
        rows = result["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        print(f"report: cannot read {path}: {why}", file=sys.stderr)
        return 3
    if not rows or "op" not in rows[0]:
        print(f"report: {path} is not `imgfilter bench --json` output", file=sys.stderr)
        return 3
    try:
        plot(result, path.with_suffix(".png"))
    except ImportError:
        print("report: matplotlib not installed, no plot written", file=sys.stderr)
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
