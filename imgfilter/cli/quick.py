"""The common command lines of blur, filter and contour, parsed without Typer.

Importing Typer (and its Click) and building a command costs a run of
`imgfilter blur photo.jpg --k 21` 40-60 ms, about a fifth of the whole command, and
slows the background read of the input meanwhile (`imgfilter.prefetch`). `parse`
takes the command lines those commands are mostly given, and `run` runs them as the
Typer command would (`filtering.run` through `worker.run_command`).

`parse(argv)` takes `blur`, `filter` or `contour`, then inputs and that command's
options (`_OPTIONS`) in any order, each option given once, as `--name VALUE`,
`--name=VALUE`, `-x VALUE` or a flag on its own, and each value one that Typer takes
as it is. It returns the options by name with the values Typer gives the command
(defaults included), or None for anything else: help, `--`, clustered or attached
short options, an option given twice or without its value, an option this module
does not take (`--gpus`, `--scheduler`), an unknown one, a value out of range or not
plain digits, a missing required option, the shell completion's environment. Typer
then parses that command line itself and reports what is wrong with it, so every
usage error still comes from one place. `tests/test_cli_quick.py` checks that what
`parse` returns equals what Typer passes the command, for many command lines.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..api import MAX_BOX_SIDE
from .values import Backend, Border, Method

COMMANDS = ("blur", "filter", "contour")


def _digits(low: int, high: int) -> Callable[[str], int | None]:
    """Plain decimal digits within [low, high] (Typer's IntRange would refuse the
    rest or read it otherwise: signs, spaces, underscores)."""

    def read(text: str) -> int | None:
        if not (text.isascii() and text.isdigit()):
            return None
        value = int(text)
        return value if low <= value <= high else None

    return read


def _choice(choices: type) -> Callable[[str], Any]:
    """A member of the Enum `choices` by name, any case (the options are declared
    case-insensitive)."""

    def read(text: str) -> Any:
        if not text.isascii():
            return None
        return next((c for c in choices if c.value.casefold() == text.casefold()), None)

    return read


def _number(text: str) -> float | None:
    try:
        return float(text)  # what Click's FLOAT does with a string
    except ValueError:
        return None


_FLAG = None  # an option without a value

# (names, destination, how its value is read), as declared in `filters` and `options`.
_COMMON: tuple[tuple[tuple[str, ...], str, Any], ...] = (
    (("--output", "-o"), "output", Path),
    (("--border",), "border", _choice(Border)),
    (("--border-value",), "border_value", _number),
    (("--backend",), "backend", _choice(Backend)),
    (("--method",), "method", _choice(Method)),
    (("--max-gpu-memory",), "max_gpu_memory", str),
    (("--out-dir",), "out_dir", Path),
    (("--name",), "name", str),
    (("--recursive", "-r"), "recursive", _FLAG),
    (("--jobs", "-j"), "jobs", _digits(1, 256)),
    (("--quality",), "quality", _digits(0, 100)),
    (("--keep-metadata",), "keep_metadata", _FLAG),
    (("--force", "-f"), "force", _FLAG),
    (("--skip-existing",), "skip_existing", _FLAG),
    (("--quiet", "-q"), "quiet", _FLAG),
    (("--debug",), "debug", _FLAG),
)
_OWN: dict[str, tuple[tuple[tuple[str, ...], str, Any], ...]] = {
    "blur": ((("--k", "-k"), "k", _digits(1, MAX_BOX_SIDE)),),
    "filter": ((("--kernel",), "kernel", str), (("--normalize",), "normalize", _FLAG)),
    "contour": (),
}
_REQUIRED = {"blur": ("k",), "filter": ("kernel",), "contour": ()}
# What Typer passes for an option not given: every filtering command's, then their own.
_DEFAULTS: dict[str, Any] = {
    "output": None,
    "border": Border.reflect101,
    "border_value": None,
    "backend": Backend.auto,
    "method": Method.auto,
    "max_gpu_memory": None,
    "out_dir": None,
    "name": None,
    "recursive": False,
    "jobs": None,
    "gpus": None,
    "scheduler": None,
    "quality": None,
    "keep_metadata": False,
    "force": False,
    "skip_existing": False,
    "quiet": False,
    "debug": False,
}
_OWN_DEFAULTS: dict[str, dict[str, Any]] = {
    "blur": {},
    "filter": {"normalize": False},
    "contour": {},
}


def _options(op: str) -> dict[str, tuple[str, Any]]:
    """`op`'s options: each name (long and short) -> (destination, reader)."""
    return {name: (dest, read) for names, dest, read in (*_OWN[op], *_COMMON) for name in names}


def parse(argv: list[str]) -> tuple[str, dict[str, Any]] | None:
    """(command, options by name) for a command line this module takes (see the module
    docstring), else None."""
    if not argv or argv[0] not in COMMANDS or "_IMGFILTER_COMPLETE" in os.environ:
        return None
    op, known = argv[0], _options(argv[0])
    given: dict[str, Any] = {}
    images: list[Path] = []
    rest = iter(argv[1:])
    for word in rest:
        if not word.startswith("-"):
            images.append(Path(word))
            continue
        name, eq, text = word.partition("=")
        if eq and not name.startswith("--"):
            return None  # `-k=21`: Click reads `=21` as the value
        if name not in known:
            return None  # help, `--`, `-`, clustered short options, unknown options
        dest, read = known[name]
        if dest in given:
            return None
        if read is _FLAG:
            if eq:
                return None
            given[dest] = True
            continue
        if not eq:
            text = next(rest, None)
            if text is None:
                return None
        value = read(text)
        if value is None:
            return None
        given[dest] = value
    if not images or any(dest not in given for dest in _REQUIRED[op]):
        return None
    return op, {"images": images, **_DEFAULTS, **_OWN_DEFAULTS[op], **given}


def run(op: str, options: dict[str, Any]) -> int:
    """Run the filtering command `op` with `options` (from `parse`) as its Typer
    command would; its exit status."""
    from . import filtering
    from .worker import Exit, run_command

    try:
        run_command(
            lambda: filtering.run(op, options),
            quiet=options["quiet"],
            debug=options["debug"],
            spinner=True,
        )
    except Exit as e:
        return e.code
    return 0
