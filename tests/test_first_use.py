"""First use of a kernel specialised for a size (issue 24): while a detached process
compiles it, its call runs a size-generic kernel that ships (the same results), then
switches to it.

`imgfilter.backends.cuda._compiling` learns whether a call's launches need a compile by
running them under `kernels.common.launch.checking()`, starts the compile of the
binary NotCompiled names (`background.start`) and says to run the stand-in until a look
finds that binary; where no compile can start, the caller compiles at once. Filters:
the register-blocked kernel (stand-in: window, `_blocked_or_window`); boxes: the uint8
kernels auto picks (stand-in: `kernels.box.plan.STAND_IN`, `_box_now`). Without a GPU
through `no_device` (test_binaries); on a GPU (`gpu`) for real.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_binaries import no_device_fixture  # noqa: F401 - the fixture no_device

import imgfilter
from imgfilter.backends import cuda as backend
from imgfilter.backends import opencv as ref
from kernels.common import launch
from kernels.common.refs import KernelRef


def _as_in_a_new_process(monkeypatch) -> None:
    """The CUDA backend as in a new process on a GPU, with background compiles on."""
    monkeypatch.setattr(backend, "SIMULATOR", False)
    monkeypatch.setattr(backend.background, "ENABLED", True)
    monkeypatch.setattr(backend, "_READY", set())
    monkeypatch.setattr(backend, "_PENDING", {})
    monkeypatch.setattr(backend, "_WEIGHTS", {})  # no made-up device weights kept


@pytest.fixture
def fresh(monkeypatch):
    """`_as_in_a_new_process`, with `background.start` noting (name, code) in the list
    returned (and succeeding)."""
    started: list = []
    _as_in_a_new_process(monkeypatch)
    monkeypatch.setattr(backend.background, "start",
                        lambda name, code: started.append((name, code)) or True)  # fmt: skip
    return started


class _Looks:
    """A launch function for `_compiling` that launches `kernel` (its binary absent
    until `found` holds its name) and counts how often it was run."""

    def __init__(self, no_device, kernel=None):
        self.kernel = kernel or KernelRef("kernels.conv.generic", "pad_image")
        self.args = (no_device.empty((4, 5, 1), np.uint8), 0, 0, 4, np.uint8(0),
                     no_device.empty((6, 7, 1), np.uint8))  # fmt: skip
        self.runs = 0

    def __call__(self) -> None:
        self.runs += 1
        launch.launch(self.kernel, 1, 1, self.args)

    @property
    def name(self) -> str:
        return launch._name(self.kernel, self.args)


def test_the_stand_in_runs_until_a_look_finds_the_binary(no_device, fresh, monkeypatch):
    looks = _Looks(no_device)
    code = "compile {}".format
    assert backend._compiling(("k", 1), looks, code)  # started: run the stand-in
    assert fresh == [(looks.name, f"compile {looks.name}")] and looks.name.startswith("launch-")
    assert backend._compiling(("k", 1), looks, code)  # looked at most every _LOOK_EVERY_S
    assert looks.runs == 1 and len(fresh) == 1
    monkeypatch.setattr(backend, "_LOOK_EVERY_S", 0.0)
    assert backend._compiling(("k", 1), looks, code)  # looked again: still compiling
    assert looks.runs == 2 and len(fresh) == 1  # not started twice
    no_device.found[looks.name] = (b"image", "_Zpad_image")  # the compile kept it
    assert not backend._compiling(("k", 1), looks, code)
    assert not backend._compiling(("k", 1), looks, code) and looks.runs == 3  # ready: no look
    assert no_device.driver.launched == []  # looks launch nothing


def test_a_failed_start_or_a_kernel_without_a_name_compiles_at_once(no_device, fresh,
                                                                    monkeypatch):  # fmt: skip
    looks = _Looks(no_device)
    monkeypatch.setattr(backend.background, "start", lambda name, code: False)
    assert not backend._compiling(("k", 2), looks, "compile {}".format)
    assert not backend._compiling(("k", 2), looks, "compile {}".format)  # and again
    monkeypatch.setattr(backend.background, "start", lambda name, code: pytest.fail("started"))
    looks.args = (*looks.args[:1], 2**63, *looks.args[2:])  # no type name: no binary name
    assert not backend._compiling(("k", 3), looks, "compile {}".format)


def test_nothing_is_looked_at_on_the_simulator_or_without_background_compiles(monkeypatch):
    def launches():
        raise AssertionError("looked")

    monkeypatch.setattr(backend, "SIMULATOR", True)
    assert not backend._compiling(("k", 4), launches, str)
    monkeypatch.setattr(backend, "SIMULATOR", False)
    monkeypatch.setattr(backend.background, "ENABLED", False)
    assert not backend._compiling(("k", 4), launches, str)


def test_window_until_the_blocked_kernel_is_compiled(no_device, fresh, monkeypatch):
    assert backend._blocked_or_window(7, 7, np.uint8) == "window"
    assert backend._blocked_or_window(7, 7, np.uint8) == "window"
    ((name, code),) = fresh  # one compile however many calls wait for it
    assert code == ("import imgfilter.backends.cuda as c; "
                    f"c.compile_blocked({name!r}, 7, 7, 'uint8')")  # fmt: skip
    monkeypatch.setattr(backend, "_LOOK_EVERY_S", 0.0)
    no_device.found[name] = (b"image", "_Zblocked")
    assert backend._blocked_or_window(7, 7, np.uint8) == "blocked"
    assert backend._blocked_or_window(7, 7, np.float32) == "window"  # another dtype
    assert fresh[-1][0] != name and fresh[-1][1].endswith("7, 7, 'float32')")
    assert no_device.driver.launched == []


def test_a_blocked_binary_already_there_means_blocked_at_once(no_device, fresh, monkeypatch):
    monkeypatch.setattr(launch, "_binary", lambda name, args: launch._Compiled(1, None))
    assert backend._blocked_or_window(21, 21, np.uint16) == "blocked"
    assert fresh == []


def test_without_a_cache_to_compile_into_blocked_compiles_at_once(no_device, monkeypatch):
    _as_in_a_new_process(monkeypatch)  # the real background.start
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", "/proc/imgfilter-no-such-cache")  # unwritable
    monkeypatch.setattr(backend.background.subprocess, "Popen",
                        lambda *a, **kw: pytest.fail("spawned"))  # fmt: skip
    assert backend._blocked_or_window(5, 5, np.uint8) == "blocked"


def test_kernels_too_big_for_the_window_tile_wait_for_blocked(fresh, monkeypatch):
    monkeypatch.setattr(backend._conv_plan, "window_fits", lambda kh, kw: False)
    assert backend._blocked_or_window(31, 31, np.uint8) == "blocked"
    assert fresh == []


def test_a_first_box_of_a_size_runs_its_stand_in_while_auto_s_kernel_compiles(
    no_device, fresh, monkeypatch
):
    """uint8 21x21 on a 120x160x3 image: auto picks box_tiled, specialised for the box;
    box_twopass (kernels.box.plan.STAND_IN) runs until a look finds tiled's binary."""
    from kernels.box import plan

    img = no_device.empty((120, 160, 3), np.uint8)
    assert plan.choose(img.shape, img.dtype, (21, 21))[0] == "tiled"
    assert plan.STAND_IN["tiled"] == "twopass"
    assert backend._box_now(img, (21, 21), (10, 10), 4, 0) == "twopass"
    ((name, code),) = fresh
    assert code == ("import imgfilter.backends.cuda as c; "
                    f"c.compile_box({name!r}, (120, 160, 3), 'uint8', (21, 21))")  # fmt: skip
    monkeypatch.setattr(backend, "_LOOK_EVERY_S", 0.0)
    no_device.found[name] = (b"image", "_Ztiled")
    assert backend._box_now(img, (21, 21), (10, 10), 4, 0) == "auto"
    # A box auto runs with a kernel that ships, and a stand-in that does not take the
    # image (misaligned: box_fused), are run as they are: nothing to look at.
    u16 = no_device.empty((120, 160, 3), np.uint16)
    assert backend._box_now(u16, (5, 5), (2, 2), 4, 0) == "auto"
    odd = no_device.empty((120, 161, 3), np.uint8)
    assert backend._box_now(odd[1:], (21, 21), (10, 10), 4, 0) == "auto"
    assert len(fresh) == 1 and no_device.driver.launched == []


@pytest.mark.gpu
def test_first_use_on_the_gpu_then_blocked(monkeypatch, tmp_path):
    """A fresh kernel size on a fresh cache: the first call runs window while a detached
    process compiles the blocked kernel into the kernel cache; the calls after that
    run blocked; every result equals OpenCV's."""
    import time

    cp = pytest.importorskip("cupy")
    monkeypatch.setattr(backend.background, "ENABLED", True)
    monkeypatch.setattr(backend, "_READY", set())
    monkeypatch.setattr(backend, "_PENDING", {})
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
    assert methods[-1] == "window"  # (the look before it runs blocked's launch, checking)
    deadline = time.monotonic() + 180
    while backend._blocked_or_window(11, 13, np.uint8) != "blocked":
        assert time.monotonic() < deadline, "the background compile never kept its binary"
        time.sleep(0.5)
    assert any(tmp_path.glob("cubins/launch-*.cubin"))
    before = len(methods)
    got = imgfilter.filter2d(cp.asarray(img), kernel).get()
    assert np.abs(got.astype(int) - want).max() <= 1
    assert methods[before:] == ["blocked"]
