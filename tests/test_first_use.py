"""First use of a kernel size (issue 24): method auto runs the size-generic window
kernel while the register-blocked kernel for that size compiles in the background,
then switches to it; the results are the same (both are cv2.filter2D's)."""

from __future__ import annotations

import numpy as np
import pytest

import imgfilter
from imgfilter.backends import cuda as backend
from imgfilter.backends import opencv as ref


def test_window_until_the_blocked_kernel_is_compiled(monkeypatch):
    started = []
    monkeypatch.setattr(backend, "_BLOCKED_READY", set())
    monkeypatch.setattr(backend, "_BLOCKED_PENDING", {})
    monkeypatch.setattr(backend.background, "compile_blocked",
                        lambda *key: started.append(key) or True)  # fmt: skip
    monkeypatch.setattr(backend.cubins, "load", lambda name, cc: None)
    monkeypatch.setattr(backend, "driver", lambda: type("D", (), {"cc": (9, 0)})())
    assert backend._blocked_or_window(7, 7, np.uint8) == "window"
    assert backend._blocked_or_window(7, 7, np.uint8) == "window"
    assert started == [(7, 7, "uint8")]  # one compile however many calls wait for it
    backend._BLOCKED_READY.add((7, 7, "uint8"))
    assert backend._blocked_or_window(7, 7, np.uint8) == "blocked"
    assert backend._blocked_or_window(7, 7, np.float32) == "window"  # another dtype
    assert started[-1] == (7, 7, "float32")


def test_a_cached_cubin_means_blocked_at_once(monkeypatch):
    monkeypatch.setattr(backend, "_BLOCKED_READY", set())
    monkeypatch.setattr(backend.background, "compile_blocked", lambda *key: pytest.fail("compiled"))
    monkeypatch.setattr(backend.cubins, "load", lambda name, cc: (b"cubin", "entry"))
    monkeypatch.setattr(backend, "driver", lambda: type("D", (), {"cc": (9, 0)})())
    assert backend._blocked_or_window(21, 21, np.uint16) == "blocked"


def test_without_a_cache_to_compile_into_blocked_compiles_at_once(monkeypatch):
    monkeypatch.setattr(backend, "_BLOCKED_READY", set())
    monkeypatch.setattr(backend, "_BLOCKED_PENDING", {})
    monkeypatch.setattr(backend.cubins, "load", lambda name, cc: None)
    monkeypatch.setattr(backend, "driver", lambda: type("D", (), {"cc": (9, 0)})())
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", "/proc/imgfilter-no-such-cache")  # unwritable
    assert backend._blocked_or_window(5, 5, np.uint8) == "blocked"


def test_kernels_too_big_for_the_window_tile_wait_for_blocked(monkeypatch):
    monkeypatch.setattr(backend, "_BLOCKED_READY", set())
    monkeypatch.setattr(backend.cubins, "load", lambda name, cc: None)
    monkeypatch.setattr(backend, "driver", lambda: type("D", (), {"cc": (9, 0)})())
    monkeypatch.setattr(backend._conv_plan, "window_fits", lambda kh, kw: False)
    assert backend._blocked_or_window(31, 31, np.uint8) == "blocked"


@pytest.mark.gpu
def test_first_use_on_the_gpu_then_blocked(monkeypatch, tmp_path):
    """A fresh kernel size on a fresh cache: the first call runs window while a detached
    process compiles the blocked kernel and exports its cubin; the calls after that
    run blocked; every result equals OpenCV's."""
    import time

    cp = pytest.importorskip("cupy")
    monkeypatch.setattr(backend.background, "ENABLED", True)
    monkeypatch.setattr(backend, "_BLOCKED_READY", set())
    monkeypatch.setattr(backend, "_BLOCKED_PENDING", {})
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))  # the child inherits it
    kernel = np.random.default_rng(3).random((11, 13)).astype(np.float32)
    img = np.random.default_rng(4).integers(0, 255, (300, 400, 3), dtype=np.uint8)
    want = ref.filter2d(img, kernel)
    methods = []
    real = backend._conv.correlate
    monkeypatch.setattr(backend._conv, "correlate",
                        lambda *a: methods.append(a[5]) or real(*a))  # fmt: skip
    got = imgfilter.filter2d(cp.asarray(img), kernel).get()
    assert np.abs(got.astype(int) - want).max() <= 1
    assert methods == ["window"]
    deadline = time.monotonic() + 180
    while backend._blocked_or_window(11, 13, np.uint8) != "blocked":
        assert time.monotonic() < deadline, "the background compile never exported its cubin"
        time.sleep(0.5)
    got = imgfilter.filter2d(cp.asarray(img), kernel).get()
    assert np.abs(got.astype(int) - want).max() <= 1
    assert methods[-1] == "blocked"
