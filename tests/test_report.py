"""BENCHMARKS.md is generated from the committed results: regenerating it must give the
committed page exactly, and the script's errors are one line on stderr (no GPU needed)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "report.py"


def _report():
    spec = importlib.util.spec_from_file_location("report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO
    )


def test_benchmarks_md_is_generated_from_the_committed_results():
    page = (REPO / "BENCHMARKS.md").read_text()
    assert _report().render() == page, "stale: python benchmarks/report.py --write BENCHMARKS.md"


def test_every_results_file_the_page_links_exists():
    report = _report()
    page = report.render()
    linked = {m for m in page.split("(benchmarks/results/")[1:]}
    names = {chunk.split(")")[0] for chunk in linked}
    assert names, "the page links no results"
    for name in names:
        assert (report.RESULTS / name).is_file(), name


def test_newest_run_of_an_area_wins(tmp_path):
    report = _report()
    newest = report._newest("pipeline", report.RESULTS)
    assert newest is not None and report._has_cvcuda(newest[1])
    with_cvcuda = newest[1]
    rows = [r for r in with_cvcuda["rows"] if not (r.get("peer") or "").startswith("cvcuda")]
    without = dict(with_cvcuda, rows=rows)
    (tmp_path / "2026-11-26n-h100-pipeline-quick.json").write_text(json.dumps(with_cvcuda))
    (tmp_path / "2026-11-26q-h100-pipeline-quick.json").write_text(json.dumps(without))
    lines = report.section_pipeline(tmp_path)
    assert "2026-11-26q-h100-pipeline-quick.json" in lines[2]
    assert "CV-CUDA per call us (2026-11-26n)" in "\n".join(lines)
    # A later run with CV-CUDA replaces both.
    (tmp_path / "2026-11-26r-h100-pipeline.json").write_text(json.dumps(with_cvcuda))
    text = "\n".join(report.section_pipeline(tmp_path))
    assert "2026-11-26r-h100-pipeline.json" in text and "(2026-11-26n)" not in text


def test_every_results_file_is_cited_by_the_page_or_the_docs():
    report = _report()
    cited = report.render() + "".join(p.read_text() for p in (REPO / "docs").rglob("*.md"))
    stray = sorted(p.name for p in report.RESULTS.iterdir() if p.name not in cited)
    assert stray == [], "results no page cites (git keeps removed runs)"


def test_without_a_file_one_line_and_nonzero():
    done = _run()
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1 and "usage" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_file_one_line_and_nonzero(tmp_path):
    for args in ([str(tmp_path / "nope.json")], ["--check", str(tmp_path / "nope.md")]):
        done = _run(*args)
        assert done.returncode != 0
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_check_reports_a_stale_page(tmp_path):
    stale = tmp_path / "B.md"
    stale.write_text("# old\n")
    done = _run("--check", str(stale))
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert _run("--check", str(REPO / "BENCHMARKS.md")).returncode == 0


def test_readme_headline_figures_are_on_the_generated_page():
    """README's speed table quotes committed results: each figure is on BENCHMARKS.md."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Speed", 1)[1].split("\n## ", 1)[0]
    cells = [c.strip(" *") for line in section.splitlines() if line.startswith("| ")
             for c in line.strip("|").split("|")[1:]]  # fmt: skip
    figures = [f for c in cells for f in re.findall(r"\d+\.\d+", c)]
    assert len(figures) >= 10, "README's speed table is missing"
    page = (REPO / "BENCHMARKS.md").read_text()
    on_page = set(re.findall(r"(?<![\d.])\d+\.\d+(?![\d.])", page))
    assert [f for f in figures if f not in on_page] == []
