"""A full GPU is an expected condition (issue 28): the command line and the API end
with one line naming the problem (exit 5 / GpuMemoryError), never an abort, a core
dump or an 'unexpected' error; or, where the work fits, the right result."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import imgfilter
from imgfilter.backends import opencv as ref


def _hog(leave_fraction: float):
    """CuPy allocations holding all but `leave_fraction` of the GPU's memory."""
    cp = pytest.importorskip("cupy")
    free, total = cp.cuda.runtime.memGetInfo()
    keep = int(total * leave_fraction)
    chunks = []
    size = free - keep
    while size > (64 << 20):
        try:
            chunks.append(cp.cuda.alloc(size))
            free_now, _ = cp.cuda.runtime.memGetInfo()
            size = free_now - keep
        except cp.cuda.memory.OutOfMemoryError:
            size //= 2
    return chunks


@pytest.mark.gpu
@pytest.mark.parametrize("leave", [0.05, 0.01, 0.002])
def test_cli_under_a_memory_hog(tmp_path, leave):
    import cv2

    img = np.random.default_rng(1).integers(0, 255, (6000, 8000, 3), dtype=np.uint8)
    src = tmp_path / "big.png"
    cv2.imwrite(str(src), img)
    out = tmp_path / "big.blur.png"
    hog = _hog(leave)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "imgfilter", "blur", str(src), "--k", "21", "-o", str(out)],
            capture_output=True, text=True, timeout=600, env=dict(os.environ),
        )  # fmt: skip
    finally:
        del hog
    assert done.returncode in (0, 5), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "unexpected" not in done.stderr
    assert "double free" not in done.stderr and "core dumped" not in done.stderr
    if done.returncode == 5:
        lines = [ln for ln in done.stderr.splitlines() if ln.startswith("imgfilter: error:")]
        assert len(lines) == 1, done.stderr
        assert not out.exists()
    else:
        got = cv2.imread(str(out), cv2.IMREAD_UNCHANGED)
        assert np.abs(got.astype(int) - ref.blur(img, 21)).max() <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("leave", [0.05, 0.002])
def test_api_under_a_memory_hog(leave):
    cp = pytest.importorskip("cupy")
    d = cp.asarray(np.random.default_rng(2).integers(0, 255, (4000, 6000, 3), dtype=np.uint8))
    hog = _hog(leave)
    try:
        try:
            out = imgfilter.blur(d, 21).copy_to_host()
        except imgfilter.GpuMemoryError as exc:
            assert "needed" in str(exc) and "free" in str(exc)
            assert isinstance(exc, MemoryError)
            return
    finally:
        del hog
    np.testing.assert_array_equal(out.shape, d.shape)
