"""Exiting without waiting for the CUDA context's teardown (`imgfilter.backends.handoff`,
`imgfilter/_linger.c`): the lingering process keeps exactly the descriptors it is
given, closes the rest at once, and ends right after the process that made it.

`pip install` builds `_linger` into the installed package; these tests build the
tree's copy into a temporary folder (skipped without a C compiler)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import extensions
import pytest

from imgfilter.backends import handoff

SOURCE = Path(handoff.__file__).parents[1] / "_linger.c"
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux only")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The folder holding a built `_linger`."""
    folder = tmp_path_factory.mktemp("linger")
    extensions.build("_linger", SOURCE, folder)
    return folder


def _gone(pid: int) -> bool:
    """Whether `pid` has ended (no process, or a zombie waiting for its new parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_the_lingering_process_holds_what_it_is_given_until_its_maker_exits(built):
    kept_r, kept_w = os.pipe()
    other_r, other_w = os.pipe()
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(built)!r})
        import _linger
        pid = _linger.hold([{kept_w}], {max(kept_w, other_w)})
        os.close({kept_w}); os.close({other_w})
        print(pid, flush=True)
        sys.stdin.read()  # until the test closes it
        os._exit(7)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             pass_fds=(kept_w, other_w))  # fmt: skip
    os.close(kept_w)
    os.close(other_w)
    try:
        lingerer = int(child.stdout.readline())
        assert lingerer != child.pid and not _gone(lingerer)
        # Only the lingerer could hold the two write ends now: it closed the other one...
        assert _readable(other_r, 5.0) and os.read(other_r, 1) == b""
        # ...and keeps the one it was given while its maker runs.
        assert not _readable(kept_r, 0.3)
        fds = f"/proc/{lingerer}/fd"
        held = {os.readlink(f"{fds}/{fd}") for fd in os.listdir(fds)}
        assert len(held) == 2 and all(link.startswith("pipe:") for link in held)
        assert not _gone(lingerer)
    finally:
        child.stdin.close()
    assert child.wait(10) == 7
    # The maker has exited: the lingerer lets go and ends.
    assert _readable(kept_r, 5.0) and os.read(kept_r, 1) == b""
    deadline = time.monotonic() + 5
    while not _gone(lingerer) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(lingerer)
    os.close(kept_r)
    os.close(other_r)


def test_hold_refuses_what_is_not_descriptors(built):
    sys.path.insert(0, str(built))
    try:
        import _linger
    finally:
        sys.path.remove(str(built))
    with pytest.raises(TypeError):
        _linger.hold(5, 10)
    with pytest.raises(TypeError):
        _linger.hold(["a"], 10)
    with pytest.raises(ValueError, match="at most"):
        _linger.hold(list(range(300)), 10)


def test_device_files_lists_this_process_descriptors():
    r, w = os.pipe()
    try:
        nvidia, highest = handoff.device_files()
    finally:
        os.close(r)
        os.close(w)
    assert highest >= max(r, w)
    assert all(os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia") for fd in nvidia)


class _FakeDriver:
    def __init__(self, mode: int) -> None:
        self.mode = mode

    def attribute(self, code: int) -> int:
        assert code == 20  # CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
        return self.mode


@pytest.fixture
def fake_gpu(monkeypatch):
    """A driver in kernels.common.cudadrv, two fake /dev/nvidia* descriptors, and a
    recording `_linger.hold`; returns the list of its calls."""
    from kernels.common import cudadrv

    calls = []

    class Linger:
        @staticmethod
        def hold(fds, highest):
            calls.append((list(fds), highest))
            return 4242

    monkeypatch.setattr(cudadrv, "_driver", _FakeDriver(0))
    monkeypatch.setattr(handoff, "device_files", lambda: ([5, 9], 12))
    monkeypatch.setattr(handoff, "_linger", Linger)
    return calls


def test_hand_off_gives_the_device_descriptors(fake_gpu):
    assert handoff.hand_off() == 4242
    assert fake_gpu == [([5, 9], 12)]


@pytest.mark.parametrize("mode", [1, 2, 3])  # exclusive thread (old), prohibited, exclusive process
def test_hand_off_leaves_a_device_that_takes_one_process_alone(fake_gpu, monkeypatch, mode):
    from kernels.common import cudadrv

    monkeypatch.setattr(cudadrv, "_driver", _FakeDriver(mode))
    assert handoff.hand_off() is None and fake_gpu == []


def test_hand_off_does_nothing_without_a_context_or_the_extension(fake_gpu, monkeypatch):
    from kernels.common import cudadrv

    monkeypatch.setattr(handoff, "device_files", lambda: ([], 12))
    assert handoff.hand_off() is None
    monkeypatch.setattr(cudadrv, "_driver", None)
    assert handoff.hand_off() is None
    monkeypatch.setattr(cudadrv, "_driver", _FakeDriver(0))
    monkeypatch.setattr(handoff, "_linger", None)
    assert handoff.hand_off() is None
    monkeypatch.setattr(os, "getpid", lambda: 1)
    assert handoff.hand_off() is None
    assert fake_gpu == []


@pytest.mark.gpu
def test_a_gpu_process_hands_its_device_files_over_and_they_are_let_go(built):
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(built)!r})
        import _linger
        from imgfilter.backends import handoff
        handoff._linger = _linger
        import numpy as np, imgfilter
        from kernels.common.cudadrv import driver
        driver()
        imgfilter.blur(np.arange(64 * 48 * 3, dtype=np.uint8).reshape(64, 48, 3), 5)
        pid = handoff.hand_off()
        links = [os.readlink(f"/proc/{{pid}}/fd/{{fd}}") for fd in os.listdir(f"/proc/{{pid}}/fd")]
        print(pid, *links, flush=True)
        os._exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    pid, *links = done.stdout.split()
    assert links and all(link.startswith(("/dev/nvidia", "pipe:")) for link in links)
    assert sum(link.startswith("pipe:") for link in links) == 1
    deadline = time.monotonic() + 10
    while not _gone(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(int(pid))
