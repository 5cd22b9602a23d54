"""Exiting without waiting for the CUDA context's teardown (`imgfilter.backends.handoff`):
the lingering process keeps exactly the descriptors it is given (not the pipe to
whoever reads the command's output), and ends right after the process that made it."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from imgfilter.backends import handoff

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux only")


def _gone(pid: int) -> bool:
    """Whether `pid` has ended (no process, or a zombie waiting for its new parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def test_the_lingering_process_holds_what_it_is_given_until_its_maker_exits():
    kept_r, kept_w = os.pipe()
    other_r, other_w = os.pipe()
    script = textwrap.dedent(f"""
        import os, sys
        from imgfilter.backends import handoff
        nvidia, others = handoff.open_files()
        assert {kept_w} in others and {other_w} in others, others
        os.set_inheritable({kept_w}, False)  # as the CUDA driver opens its device files
        pid = handoff.hold([{kept_w}], others)
        os.close({kept_w}); os.close({other_w})
        print(pid, flush=True)
        sys.stdin.read()  # until the test closes it
        os._exit(7)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                             pass_fds=(kept_w, other_w))  # fmt: skip
    os.close(kept_w)
    os.close(other_w)
    try:
        line = child.stdout.readline()
        assert line, child.stderr.read()
        lingerer = int(line)
        assert lingerer != child.pid and not _gone(lingerer)
        # Only the lingerer could hold the two write ends now: it has not the other one...
        assert _readable(other_r, 5.0) and os.read(other_r, 1) == b""
        # ...and keeps the one it was given while its maker runs.
        assert not _readable(kept_r, 0.3)
        fds = f"/proc/{lingerer}/fd"
        held = {int(fd): os.readlink(f"{fds}/{fd}") for fd in os.listdir(fds)}
        assert held[kept_w].startswith("pipe:")
        assert held[1] == held[2] == os.devnull  # not its maker's stdout or stderr
        assert set(held) == {0, 1, 2, kept_w}, held
        assert not _gone(lingerer)
    finally:
        child.stdin.close()
    assert child.wait(10) == 7
    # The maker has exited: its stdout ends at once (the lingerer does not hold it)...
    assert child.stdout.read() == b""
    # ...and the lingerer lets go of what it kept and ends.
    assert _readable(kept_r, 5.0) and os.read(kept_r, 1) == b""
    deadline = time.monotonic() + 5
    while not _gone(lingerer) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(lingerer)
    os.close(kept_r)
    os.close(other_r)


def test_open_files_lists_this_process_descriptors():
    r, w = os.pipe()
    try:
        nvidia, others = handoff.open_files()
    finally:
        os.close(r)
        os.close(w)
    assert {0, 1, 2, r, w} <= set(others)
    assert all(os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia") for fd in nvidia)
    assert not set(nvidia) & set(others)


class _FakeDriver:
    def __init__(self, mode: int) -> None:
        self.mode = mode

    def attribute(self, code: int) -> int:
        assert code == 20  # CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
        return self.mode


@pytest.fixture
def fake_gpu(monkeypatch):
    """A driver in kernels.common.cudadrv, two fake /dev/nvidia* descriptors, and a
    recording `hold`; returns the list of its calls."""
    from kernels.common import cudadrv

    calls = []

    def hold(fds, others):
        calls.append((list(fds), list(others)))
        return 4242

    monkeypatch.setattr(cudadrv, "_driver", _FakeDriver(0))
    monkeypatch.setattr(handoff, "open_files", lambda: ([5, 9], [0, 1, 2, 12]))
    monkeypatch.setattr(handoff, "hold", hold)
    return calls


def test_hand_off_gives_the_device_descriptors(fake_gpu):
    assert handoff.hand_off() == 4242
    assert fake_gpu == [([5, 9], [0, 1, 2, 12])]


@pytest.mark.parametrize("mode", [1, 2, 3])  # exclusive thread (old), prohibited, exclusive process
def test_hand_off_leaves_a_device_that_takes_one_process_alone(fake_gpu, monkeypatch, mode):
    from kernels.common import cudadrv

    monkeypatch.setattr(cudadrv, "_driver", _FakeDriver(mode))
    assert handoff.hand_off() is None and fake_gpu == []


def test_hand_off_does_nothing_without_a_context(fake_gpu, monkeypatch):
    from kernels.common import cudadrv

    monkeypatch.setattr(handoff, "open_files", lambda: ([], [0, 1, 2]))
    assert handoff.hand_off() is None
    monkeypatch.setattr(cudadrv, "_driver", None)
    assert handoff.hand_off() is None
    monkeypatch.setattr(cudadrv, "_driver", _FakeDriver(0))
    monkeypatch.setattr(os, "getpid", lambda: 1)
    assert handoff.hand_off() is None
    assert fake_gpu == []


def test_hand_off_exits_the_ordinary_way_where_no_process_starts(monkeypatch):
    from kernels.common import cudadrv

    def refused(*args, **kwargs):
        raise OSError("no more processes")

    monkeypatch.setattr(cudadrv, "_driver", _FakeDriver(0))
    monkeypatch.setattr(handoff, "open_files", lambda: ([5], [0, 1, 2]))
    monkeypatch.setattr(os, "posix_spawn", refused)
    assert handoff.hand_off() is None


@pytest.mark.gpu
def test_a_gpu_process_hands_its_device_files_over_and_they_are_let_go():
    script = textwrap.dedent("""
        import os, time
        import numpy as np, imgfilter
        from imgfilter.backends import handoff
        from kernels.common.cudadrv import driver
        driver()
        imgfilter.blur(np.arange(64 * 48 * 3, dtype=np.uint8).reshape(64, 48, 3), 5)
        pid = handoff.hand_off()
        time.sleep(0.5)  # its Python started (whose files are closed by then)
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        print(pid, *links, flush=True)
        os._exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_env(), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    pid, *links = done.stdout.split()
    nvidia = [link for link in links if link.startswith("/dev/nvidia")]
    assert nvidia and sum(link.startswith("pipe:") for link in links) == 1
    assert len(links) == len(nvidia) + 3  # stdin (the pipe) and /dev/null twice
    deadline = time.monotonic() + 10
    while not _gone(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(int(pid))
