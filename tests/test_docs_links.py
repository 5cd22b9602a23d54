"""Every repository path the docs name exists, so a doc cannot point at a file that is gone.

Checked in README.md, BENCHMARKS.md, CHANGELOG.md and docs/**/*.md: inline code and
fenced code holding a token that starts with a top-level folder of the repository
(`imgfilter/...`, `kernels/...`, `benchmarks/...`, `docs/...`, `tests/...`,
`samples/...`, `tools/...`), taken from the repository root; the files of a tree
drawn in fenced code under such a folder (`kernels/` over an indented `  box/` over
`    plan.py`); and the targets of Markdown links and images, taken from the page's
own folder. Patterns and placeholders (`*`, `<op>`, `{stem}`, `...`) are not paths
and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PREFIXES = ("imgfilter", "kernels", "benchmarks", "docs", "tests", "samples", "tools")
PAGES = sorted(
    [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "CHANGELOG.md"]
    + list((ROOT / "docs").rglob("*.md"))
)

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_TOKEN = re.compile(r"(?<![\w./-])((?:" + "|".join(PREFIXES) + r")/[\w./+-]*)")
_PLACEHOLDER = re.compile(r"[*<>{}\[\]]|\.\.\.")
_TREE_ENTRY = re.compile(
    r"^( *)([\w.-]+/|[\w.-]+\.(?:py|c|md|rst|txt|json|toml|sh|cfg|png|jpg|npy|npz|cubin))"
    r"(?=[\s,]|$)"
)


def _code_paths(text: str) -> set[str]:
    """Repository paths in a page's inline and fenced code."""
    code = [m.group(0) for m in _FENCE.finditer(text)]
    code += [m.group(1) for m in _INLINE.finditer(_FENCE.sub("", text))]
    found = set()
    for chunk in code:
        for m in _TOKEN.finditer(chunk):
            end = m.end()
            if end < len(chunk) and _PLACEHOLDER.match(chunk[end:]):
                continue  # imgfilter/<op>, benchmarks/results/*.json, tests/...
            path = m.group(1).split("::")[0].rstrip(".,:;")
            if not _PLACEHOLDER.search(path):
                found.add(path)
    for block in code[: len(_FENCE.findall(text))]:
        found |= _tree_paths(block)
    return found


def _tree_paths(block: str) -> set[str]:
    """Paths of a file tree drawn by indentation under a repository folder."""
    found, stack = set(), []  # stack: (indent, folder) of the open folders
    for line in block.splitlines():
        m = _TREE_ENTRY.match(line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not stack and name.split("/")[0] not in PREFIXES:
            continue
        path = "".join(folder for _, folder in stack) + name
        found.add(path)
        if name.endswith("/"):
            stack.append((indent, name))
    return found


def _link_targets(text: str) -> set[str]:
    """Local targets of a page's Markdown links and images (no URLs, no anchors)."""
    targets = set()
    for m in _LINK.finditer(_INLINE.sub("", _FENCE.sub("", text))):
        target = m.group(1).split("#")[0]
        if target and not re.match(r"[a-z][a-z0-9+.-]*:", target):
            targets.add(target)
    return targets


def missing_paths(page: Path, text: str | None = None) -> list[str]:
    """The paths a page names that do not exist in the repository."""
    text = page.read_text(encoding="utf-8") if text is None else text
    missing = [p for p in sorted(_code_paths(text)) if not (ROOT / p).exists()]
    missing += [t for t in sorted(_link_targets(text)) if not (page.parent / t).exists()]
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(page):
    assert page.is_file(), f"{page.relative_to(ROOT)} is missing"
    assert missing_paths(page) == [], f"{page.relative_to(ROOT)} names missing paths"


def test_a_missing_path_is_caught():
    page = ROOT / "docs" / "design.md"
    text = (
        "The CLI is `imgfilter/cli.py`, see [the driver](../kernels/common/driver.py),\n"
        "```\npython benchmarks/no_such_probe.py --json r.json\n```\n"
        "and `tests/test_docs_links.py::test_a_missing_path_is_caught` exists, as do\n"
        "`imgfilter/<op>.py`, `benchmarks/results/*.json` and [design](design.md).\n"
        "```\nimgfilter/\n  api.py      the API\n              more words\n"
        "  backends/\n    cuda.py\n    gone.py   (it was)\n  errors.py\n```\n"
    )
    assert missing_paths(page, text) == [
        "benchmarks/no_such_probe.py",
        "imgfilter/backends/gone.py",
        "imgfilter/cli.py",
        "../kernels/common/driver.py",
    ]
