"""The `imgfilter` command: parse options, call the array API, report. Thin.

    imgfilter blur INPUT... --k K [-o OUT | --out-dir DIR --name TEMPLATE]
    imgfilter filter INPUT... --kernel SPEC [--normalize] [-o OUT | --out-dir DIR ...]
    imgfilter contour INPUT... [-o OUT | --out-dir DIR ...]
    imgfilter gaussian|edges|sharpen INPUT... [--k K] [--sigma S] [-o OUT | --out-dir DIR ...]
    imgfilter compare INPUT (--k K | --kernel SPEC [--normalize] | --contour) [--json]
    imgfilter bench [--sizes LIST] [--pipeline] [--json FILE]
    imgfilter train INPUT LABELS [-o MODEL.npz];  imgfilter classify INPUT... -m MODEL.npz

Every error is one line on stderr, `imgfilter: error: <message>`, with the exit code of
its class (imgfilter.errors: 2 usage, 3 input, 4 output, 5 device; 1 anything else);
`--debug` adds the traceback. Click's own usage errors are reported the same way.
`imgfilter` alone prints the help on stdout and exits 2, as a Typer app does.
Ctrl-C ends a command at once: one line `imgfilter: interrupted`, exit 130, no output
or temporary file left (`output.end_interrupted`, the command line's SIGINT handler).
Informational lines (what was written, notes) go to stderr too; `--quiet` drops them.

One parser, Typer. Heavy modules (NumPy, OpenCV, Numba, rich, imgfilter.io, the
backends) are imported inside the commands, and a command's own module when the
command is first looked up (`typer_app.COMMANDS`): `imgfilter blur` builds `blur`
alone.

Modules: `typer_app` (the Typer app `app`, its one-line Click errors, the `command`
decorator), `worker` (worker thread, spinner, one-line errors and exit codes),
`output` (stderr lines, Ctrl-C), `options` (the shared Typer options), `values` (what
option values are and resolve to), `many` (several inputs), `filtering` (what the
filtering commands do), and the commands' Typer declarations: `filters` (blur,
filter, contour, gaussian, edges, sharpen), `compare`, `bench`, `classify` (train,
classify). Only `typer_app`, `options` and the declarations import Typer.
"""

from __future__ import annotations

import sys
from typing import Any

from .output import INTERRUPTED, PROG, interrupted_line

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Run the command line `argv` (default sys.argv[1:]) through the Typer app. Ends
    with SystemExit as Typer does. (`python -m imgfilter` and the `imgfilter` console
    script come through `imgfilter.__main__`, which also handles Ctrl-C.)"""
    args = sys.argv[1:] if argv is None else argv
    try:
        from .typer_app import app

        app(args=args, prog_name=PROG)
    except KeyboardInterrupt:  # in a process without the SIGINT handler (tests)
        interrupted_line()
        sys.exit(INTERRUPTED)


def __getattr__(name: str) -> Any:
    # `imgfilter.cli.app`, the Typer app, imported when first asked for.
    if name == "app":
        from .typer_app import app

        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
