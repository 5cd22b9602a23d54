"""The console entry ends the process without the interpreter's teardown
(`imgfilter.__main__._exit`): same exit codes and stream contents as sys.exit, atexit
handlers run, and the normal exit whenever another non-daemon thread still runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from imgfilter import __main__ as entry

ROOT = Path(__file__).resolve().parent.parent


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


@pytest.fixture
def exits(monkeypatch):
    """os._exit recorded instead of taken; atexit handlers counted; `_exit` sees only
    this thread and the test's own threads (`threads`), not those earlier tests left."""
    ran = []
    monkeypatch.setattr(entry.os, "_exit", lambda code: (_ for _ in ()).throw(_Exited(code)))
    monkeypatch.setattr(entry.atexit, "_run_exitfuncs", lambda: ran.append(True))
    here = threading.current_thread()
    view = types.SimpleNamespace(current_thread=lambda: here, threads=[])
    view.enumerate = lambda: [here, *view.threads]
    monkeypatch.setattr(entry, "threading", view)
    return ran, view.threads


@pytest.mark.parametrize(("status", "code"), [(None, 0), (0, 0), (2, 2), (130, 130)])
def test_exit_codes_as_sys_exit(exits, status, code) -> None:
    with pytest.raises(_Exited) as done:
        entry._exit(status)
    assert done.value.code == code
    assert exits[0] == [True]


def test_message_status_is_printed_and_exits_1(exits, capsys) -> None:
    with pytest.raises(_Exited) as done:
        entry._exit("imgfilter: something went wrong")
    assert done.value.code == 1
    assert capsys.readouterr().err == "imgfilter: something went wrong\n"


@pytest.mark.parametrize("daemon", [False, True])
def test_only_a_live_non_daemon_thread_keeps_the_normal_exit(exits, daemon) -> None:
    """A non-daemon thread still running: `_exit` returns (the interpreter's exit will
    wait for it); a daemon thread does not hold it."""
    release = threading.Event()
    worker = threading.Thread(target=release.wait, daemon=daemon)
    worker.start()
    exits[1].append(worker)
    try:
        if daemon:
            with pytest.raises(_Exited):
                entry._exit(0)
        else:
            entry._exit(0)
    finally:
        release.set()
        worker.join()
    assert exits[0] == ([True] if daemon else [])


@pytest.mark.parametrize("driver_loaded", [False, True])
def test_the_gpu_teardown_is_handed_off_last_when_the_driver_was_loaded(
    exits, monkeypatch, driver_loaded
) -> None:
    """With kernels.common.cudadrv imported, `_exit` calls handoff.hand_off after the
    atexit handlers and right before os._exit; without it, never."""
    from imgfilter.backends import handoff

    order = exits[0]
    monkeypatch.setattr(handoff, "hand_off", lambda: order.append("hand_off"))
    modules = dict(sys.modules)
    if driver_loaded:
        modules["kernels.common.cudadrv"] = types.ModuleType("kernels.common.cudadrv")
    else:
        modules.pop("kernels.common.cudadrv", None)
    monkeypatch.setattr(sys, "modules", modules)
    with pytest.raises(_Exited):
        entry._exit(0)
    assert order == ([True, "hand_off"] if driver_loaded else [True])


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)  # fmt: skip


def test_atexit_handlers_and_buffered_output_survive() -> None:
    """A real process: buffered stdout and an atexit handler's output both arrive, the
    exit status is the command's, and the interpreter's teardown (which would finalize
    a module-level object) is skipped."""
    done = _run(
        "import atexit, sys\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        "        sys.stdout.write('torn down\\n')\n"
        "kept = Finalized()\n"
        "atexit.register(lambda: print('handler ran', flush=True))\n"
        "sys.stdout.write('buffered line\\n')\n"
        "sys.argv = ['imgfilter', 'blur', 'no-such-file.png', '--k', '3', '-o', 'x.png']\n"
        "from imgfilter.__main__ import main\n"
        "main()\n"
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered line\nhandler ran\n"
    assert "no-such-file.png" in done.stderr
