"""The `imgfilter` command: parse options, call the array API, report. Thin.

    imgfilter blur INPUT... --k K [-o OUT | --out-dir DIR --name TEMPLATE]
    imgfilter filter INPUT... --kernel SPEC [--normalize] [-o OUT | --out-dir DIR ...]
    imgfilter contour INPUT... [-o OUT | --out-dir DIR ...]
    imgfilter compare INPUT (--k K | --kernel SPEC [--normalize] | --contour) [--json]
    imgfilter bench [--sizes LIST] [--pipeline] [--json FILE]
    imgfilter train INPUT LABELS [-o MODEL.npz];  imgfilter classify INPUT... -m MODEL.npz

Every error is one line on stderr, `imgfilter: error: <message>`, with the exit code of
its class (imgfilter.errors: 2 usage, 3 input, 4 output, 5 device; 1 anything else);
`--debug` adds the traceback. Click's own usage errors are reported the same way.
Ctrl-C ends a command within a fraction of a second: one line `imgfilter: interrupted`,
exit 130, no output or temporary file left (see `worker.in_worker`).
Informational lines (what was written, notes) go to stderr too; `--quiet` drops them.
Heavy modules (numba, cv2, imgfilter.io, the backends) are imported inside the
commands, so `imgfilter --help` stays quick, and a command's own module is imported
when the command is first looked up (`app.COMMANDS`): `imgfilter blur` builds `blur`
alone.

Modules: `app` (the Typer app, one-line errors, the `command` decorator), `worker`
(worker thread, Ctrl-C, spinner), `output` (stderr lines), `options` (the shared
options), `many` (several inputs), and the commands: `filters` (blur, filter,
contour), `compare`, `bench`, `classify` (train, classify).
"""

from __future__ import annotations

import sys

from .app import app
from .output import INTERRUPTED, PROG, interrupted_line

__all__ = ["app", "main"]


def main() -> None:
    """Entry point for `python -m imgfilter` and the `imgfilter` console script."""
    try:
        app(prog_name=PROG)
    except KeyboardInterrupt:  # before or after a command (parsing, exiting)
        interrupted_line()
        sys.exit(INTERRUPTED)
