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
when the command is first looked up (`typer_app.COMMANDS`): `imgfilter blur` builds
`blur` alone.

The common command lines of blur, filter and contour (inputs and the usual options)
are parsed without Typer, whose import would cost such a run tens of milliseconds
(`quick`); every other command line goes through Typer. Both call the same
`filtering.run` with the same values (tests/test_cli_quick.py checks them alike).

Modules: `typer_app` (the Typer app `app`, its one-line Click errors, the `command`
decorator), `quick` (the command lines parsed without Typer), `worker` (worker
thread, Ctrl-C, spinner, one-line errors and exit codes), `output` (stderr lines),
`options` (the shared Typer options), `values` (what option values are and resolve
to), `many` (several inputs), `filtering` (what blur, filter and contour do), and the
commands' Typer declarations: `filters` (blur, filter, contour), `compare`, `bench`,
`classify` (train, classify). Only `typer_app`, `options` and the declarations import
Typer.
"""

from __future__ import annotations

import sys
from typing import Any

from .output import INTERRUPTED, PROG, interrupted_line

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point for `python -m imgfilter` and the `imgfilter` console script: the
    command line `argv` (default sys.argv[1:]) through `quick` where it can take it,
    else through Typer. Ends with SystemExit as Typer does."""
    args = sys.argv[1:] if argv is None else argv
    try:
        from . import quick

        parsed = quick.parse(args)
        if parsed is not None:
            sys.exit(quick.run(*parsed))
        from .typer_app import app

        app(args=args, prog_name=PROG)
    except KeyboardInterrupt:  # before or after a command (parsing, exiting)
        interrupted_line()
        sys.exit(INTERRUPTED)


def __getattr__(name: str) -> Any:
    # `imgfilter.cli.app`, the Typer app, imported when first asked for (Typer's import
    # is what `quick` saves).
    if name == "app":
        from .typer_app import app

        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
