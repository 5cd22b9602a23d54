"""The API reference (docs/api) builds from the docstrings with warnings as errors.

Runs `sphinx-build -W -n -b html docs/api <tmp>` as CI does (the test extra installs
Sphinx) and checks that the pages hold the public functions. The build imports the
modules on Numba's CUDA simulator (docs/api/conf.py), so it needs no GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="Sphinx is not installed (pip install '.[test]')")

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ("blur", "filter2d", "contour", "softmax", "gemv")


def test_api_reference_builds(tmp_path):
    out = tmp_path / "html"
    cmd = [sys.executable, "-m", "sphinx", "-W", "-n", "-q", "-b", "html", "docs/api", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"sphinx-build failed:\n{run.stdout}\n{run.stderr}"

    index = (out / "index.html").read_text(encoding="utf-8")
    for name in PUBLIC:
        assert name in index, f"the reference's index does not mention {name}"
    # Each function is documented (autodoc found it), not only named.
    everything = (out / "genindex.html").read_text(encoding="utf-8")
    for target in (
        "imgfilter.blur",
        "imgfilter.filter2d",
        "imgfilter.contour",
        "imgfilter.dask.blur",
        "imgfilter.classify.train",
        "imgfilter.compare.agreement",
        "kernels.softmax.softmax",
        "kernels.linalg.gemv.gemv",
        "kernels.linalg.matmul.matmul",
    ):
        assert f'#{target}"' in everything, f"{target} is missing from the reference"
