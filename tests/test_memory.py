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
@pytest.mark.gpu_alone
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
@pytest.mark.gpu_alone
@pytest.mark.parametrize("leave", [0.05, 0.002])
def test_api_under_a_memory_hog(leave):
    cp = pytest.importorskip("cupy")
    d = cp.asarray(np.random.default_rng(2).integers(0, 255, (4000, 6000, 3), dtype=np.uint8))
    hog = _hog(leave)
    try:
        try:
            out = imgfilter.blur(d, 21).get()
        except imgfilter.GpuMemoryError as exc:
            assert "needed" in str(exc) and "free" in str(exc)
            assert isinstance(exc, MemoryError)
            return
    finally:
        del hog
    np.testing.assert_array_equal(out.shape, d.shape)


@pytest.mark.gpu
@pytest.mark.gpu_alone
def test_cupys_cached_blocks_are_given_back_when_the_gpu_is_full():
    """CuPy's pool holding nearly all the GPU in unused blocks (freed arrays it
    keeps cached): imgfilter's allocation fails, asks CuPy to give them back, and the
    call succeeds with the same result."""
    cp = pytest.importorskip("cupy")
    from kernels.common import devarray

    # A DeviceArray view: its result comes from imgfilter's pool (a CuPy array's would
    # come from CuPy's own, which frees its cache itself).
    c = cp.asarray(np.random.default_rng(3).integers(0, 255, (4000, 6000, 3), dtype=np.uint8))
    d = devarray.as_device_array(c)
    want = imgfilter.blur(d, 21).copy_to_host()
    devarray.POOL.trim()  # nothing cached on imgfilter's side for the next call
    hog = _hog(0.0002)  # all but ~16 MB of an 80 GB GPU; the result needs 72 MB
    held = sum(block.mem.size for block in hog)
    del hog
    pool = cp.get_default_memory_pool()
    assert pool.free_bytes() >= held  # freed, but cached by CuPy
    got = imgfilter.blur(d, 21).copy_to_host()
    assert pool.free_bytes() < held
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------ host images in bands (any machine)
# These exercise the CUDA backend's retry in bands (`cuda._queue` failing).


def _ops(border):
    kernel = np.array([[1, 0, -2], [0.5, 3, 1], [2, -1, 1], [1, 1, 1]], np.float32)
    kw = {"border": border, "border_value": 9, "backend": "cuda"}
    return {
        "blur": lambda a: imgfilter.blur(a, (3, 5), **kw),
        "blur_anchor": lambda a: imgfilter.blur(a, 4, anchor=(0, 3), **kw),
        "filter2d": lambda a: imgfilter.filter2d(a, kernel, **kw),
        "contour": lambda a: imgfilter.contour(a, **kw),
    }


@pytest.mark.parametrize(
    "border,dtype,gpu_rows",
    [("reflect101", np.uint8, 9), ("constant", np.uint8, 9), ("wrap", np.uint8, 9),
     ("reflect", np.uint16, 6)],
)  # fmt: skip
def test_a_host_image_the_gpu_cannot_hold_is_filtered_in_bands(monkeypatch, border, dtype,
                                                                gpu_rows):  # fmt: skip
    """When the GPU cannot hold more than a few rows (`gpu_rows`), host images go
    through in bands with a halo of real rows: the same result as the whole image. Of
    15 rows, the first bands with their halo are 8 or 9 rows: 9 takes them, 6 has
    them split again (15 launches an op instead of 3). Gray images: the bands are
    full rows whatever the channels, at half the simulator's cost of three."""
    from imgfilter.backends import cuda as backend
    from imgfilter.errors import GpuMemoryError

    rng = np.random.default_rng(3)
    img = rng.integers(1, np.iinfo(dtype).max, (15, 7)).astype(dtype)
    whole = {name: op(img) for name, op in _ops(border).items()}
    real_queue, calls = backend._queue, []

    def small_gpu(key, call, out_shape, run, *rest):
        calls.append(call.img.shape[0])
        if call.img.shape[0] > gpu_rows:
            raise GpuMemoryError("the GPU is out of memory (test)")
        return real_queue(key, call, out_shape, run, *rest)

    monkeypatch.setattr(backend, "_queue", small_gpu)
    for name, op in _ops(border).items():
        calls.clear()
        got = op(img)
        assert max(calls) > gpu_rows >= min(calls), calls  # it tried whole, then bands
        split_again = any(gpu_rows < n < len(img) for n in calls)
        assert split_again == (gpu_rows < 8), calls
        np.testing.assert_array_equal(got, whole[name], err_msg=name)


def test_bands_give_up_when_a_band_would_be_no_smaller(monkeypatch):
    from imgfilter.backends import cuda as backend
    from imgfilter.errors import GpuMemoryError

    def no_gpu(key, call, out_shape, run, *rest):
        raise GpuMemoryError("the GPU is out of memory (test)")

    monkeypatch.setattr(backend, "_queue", no_gpu)
    with pytest.raises(GpuMemoryError):
        imgfilter.blur(np.ones((40, 8), np.uint8), 3, backend="cuda")


def test_no_bands_without_the_memory_for_a_context(monkeypatch):
    """A GPU too full to open a CUDA context: one GpuMemoryError that says so, no
    band attempts (each would fail the same way)."""
    from imgfilter.backends import cuda as backend
    from kernels.common.cudadrv import NoMemoryForContext

    attempts = []

    def no_context(key, call, out_shape, run, *rest):
        attempts.append(call)
        raise NoMemoryForContext("the GPU has too little free memory to open a CUDA context", 2)

    monkeypatch.setattr(backend, "_queue", no_context)
    with pytest.raises(imgfilter.GpuMemoryError, match="open a CUDA context"):
        imgfilter.blur(np.ones((40, 8), np.uint8), 3, backend="cuda")
    assert len(attempts) == 1
