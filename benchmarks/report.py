"""Turn a benchmark JSON (from `python -m imgfilter.bench --json`) into a plot and a
Markdown table for BENCHMARKS.md.

    python benchmarks/report.py benchmarks/results/<run>.json

Writes <run>.png (time vs kernel size, imgfilter and its peers, log scale) and prints
the Markdown table. Needs matplotlib (a development tool, not a dependency).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from imgfilter.bench import best_ours

SHAPES = {"seed": "2167x2495x3", "4k": "3840x2160x3", "8k": "7680x4320x3"}


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


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python benchmarks/report.py RESULTS.json  (from imgfilter bench --json)",
              file=sys.stderr)  # fmt: skip
        return 2
    path = Path(sys.argv[1])
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"report: cannot read {path}: {exc}", file=sys.stderr)
        return 3
    plot(result, path.with_suffix(".png"))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
