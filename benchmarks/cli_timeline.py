"""Where one CLI run's wall time goes: a timeline from process start to process end.

    python benchmarks/cli_timeline.py [--runs N] -- blur IMG --k 21 -o OUT.jpg --force

Runs `imgfilter ARGS` N times (default 5), each in a fresh process as `python -m
imgfilter` would, with marks at: the interpreter ready, the CUDA context thread's start
and end (`imgfilter.backends.warmup`), the input's background read started (after NumPy
and OpenCV are imported) and its start and end (`imgfilter.prefetch`), the CLI imported,
the command's wait for that read, the image read, the filter's start and end (and the
wait for the context inside it), the write's start and end, and the exit call; the
process's end is taken by the parent, so the last row is what exiting costs (the driver
tearing the context down). Each run starts half a second after the previous one ended
(its context's teardown, handed to another process, over). Prints each run's marks in
ms since the parent started the process, and the median of each.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time

MARKS: list[tuple[str, float]] = []


def _mark(label: str) -> None:
    MARKS.append((label, time.monotonic()))


def _wrap(owner, name: str, label: str) -> None:
    fn = getattr(owner, name)

    def wrapped(*args, **kwargs):
        _mark(f"{label} start")
        try:
            return fn(*args, **kwargs)
        finally:
            _mark(f"{label} end")

    setattr(owner, name, wrapped)


def child(argv: list[str], marks_path: str) -> None:
    """Run the command as imgfilter.__main__.main does, with marks."""
    _mark("interpreter ready")
    from imgfilter.backends import warmup

    _wrap(warmup, "_open", "cuda context (thread)")
    _wrap(warmup, "driver", "wait for context")
    warmup.start(argv)
    from imgfilter import prefetch

    _wrap(prefetch, "_read", "input read (thread)")
    _wrap(prefetch, "settle", "command waits for the read")
    prefetch.start(argv)
    _mark("input read started")
    from imgfilter import cli

    _mark("cli imported")
    from imgfilter import __main__ as entry
    from imgfilter.cli import filtering

    _wrap(filtering, "run", "command (parsed)")
    from imgfilter import api, io

    _wrap(io, "read_image", "read")
    _wrap(io, "write_image", "write")
    for op in ("blur", "filter2d", "contour"):
        _wrap(api, op, f"filter ({op})")
    exit_fn = entry._exit

    def exit_with_marks(status) -> None:
        _mark("exit called")
        with open(marks_path, "w") as f:
            json.dump(MARKS, f)
        exit_fn(status)

    entry._exit = exit_with_marks
    sys.argv = ["imgfilter", *argv]
    try:
        cli.main()
    except SystemExit as done:
        entry._exit(done.code)
        raise
    entry._exit(0)


def run_once(argv: list[str]) -> list[tuple[str, float]]:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        t0 = time.monotonic()
        cmd = [sys.executable, __file__, "--child", f.name, "--", *argv]
        done = subprocess.run(cmd, capture_output=True, text=True)
        t_end = time.monotonic()
        if done.returncode != 0:
            raise SystemExit(f"failed: {done.stderr.strip()}")
        marks = json.load(open(f.name))
    return [(label, (t - t0) * 1e3) for label, t in marks] + [("process ended", (t_end - t0) * 1e3)]


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--child":
        child(args[3:], args[1])
        return
    runs = 5
    if args and args[0] == "--runs":
        runs, args = int(args[1]), args[2:]
    if args and args[0] == "--":
        args = args[1:]
    run_once(args)  # warm the kernel cache and the page cache
    table: dict[str, list[float]] = {}
    for i in range(runs):
        time.sleep(0.5)
        marks = run_once(args)
        print(f"run {i + 1}: " + ", ".join(f"{label} {ms:.0f}" for label, ms in marks))
        for label, ms in marks:
            table.setdefault(label, []).append(ms)
    print(f"\nmedian of {runs} runs, ms since the process was started: imgfilter {' '.join(args)}")
    for label, values in sorted(table.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  {label:<34} {statistics.median(values):7.1f}")


if __name__ == "__main__":
    main()
