"""The Typer app: one-line errors with their exit codes, clean help, `--version`.

The commands' modules are imported when a command is first needed (`COMMANDS`): a run
of `imgfilter blur` imports and builds `blur` alone, `--help` all of them.
`command` wraps every command in `worker.run_command`: it runs in a worker thread
(Ctrl-C, the spinner), and an ImgFilterError becomes one stderr line and its exit code
(imgfilter.errors: 2 usage, 3 input, 4 output, 5 device; 1 anything else). Click's
own usage errors are reported the same way (`_Commands`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command_from_info

try:  # recent Typer vendors Click as typer._click; older Typer depends on Click.
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - depends on the installed Typer
    from click import exceptions as click_exc

from .. import __version__
from .output import INTERRUPTED, PROG, fail, interrupted_line
from .worker import Exit, run_command

# Each command and the module (in imgfilter.cli) that registers it, in the order --help
# lists them.
COMMANDS = {
    "blur": "filters",
    "filter": "filters",
    "contour": "filters",
    "gaussian": "filters",
    "edges": "filters",
    "sharpen": "filters",
    "compare": "compare",
    "bench": "bench",
    "train": "classify",
    "classify": "classify",
}


class _Commands(TyperGroup):
    """The `imgfilter` group: commands built when first looked up, Click's usage errors
    (bad option values, unknown options) reported as one line, exit 2.

    Typer builds the group from the commands registered so far (none, unless a command
    module was imported before); `get_command` imports a command's module and builds the
    command the first time it is asked for, `list_commands` (help, completion,
    suggestions) all of them. Building every command costs a run about as much as
    importing Typer's Click does."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self._add(cmd_name)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: Any) -> list[str]:
        for name in COMMANDS:
            if name not in self.commands:
                self._add(name)
        order = [*COMMANDS, *(name for name in self.commands if name not in COMMANDS)]
        self.commands = {name: self.commands[name] for name in order if name in self.commands}
        return super().list_commands(ctx)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in COMMANDS:
            self.list_commands(ctx)  # an unknown name: Typer suggests from all commands
        return super().resolve_command(ctx, args)

    def _add(self, name: str) -> None:
        importlib.import_module(f"{__package__}.{COMMANDS[name]}")
        info = next(c for c in app.registered_commands if c.name == name)
        built = get_command_from_info(
            info,
            pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=app.rich_markup_mode,
        )
        self.add_command(built, name)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name or PROG, complete_var, standalone_mode=False, **extra)
        except click_exc.NoArgsIsHelpError as e:
            # `imgfilter` alone: the help once and exit 2, as a Typer app does. Typer's
            # rich help is printed on stdout as it is made, which leaves the error's
            # message empty: Click would add an empty line on stderr.
            if e.format_message().strip():
                e.show()
            rv = e.exit_code
        except click_exc.ClickException as e:
            rv = _click_error(e)
        except typer.Abort as e:
            rv = _aborted(e)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)

    def get_params(self, ctx: Any) -> list[Any]:
        return _clean_help_params(super().get_params(ctx))

    def invoke(self, ctx: Any) -> Any:
        # Ctrl-C while a command runs in this thread (a command run outside the main
        # thread, or a KeyboardInterrupt raised by the command itself): one line, 130.
        # Typer and Click would turn it into a silent exit 130 or "Aborted!".
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted_line()
            raise typer.Exit(INTERRUPTED) from None


def _click_error(e: Any) -> int:
    """Click's error as one line (with where to look for a usage error); its exit code."""
    # Typer validates through pydantic, whose messages start "Value error, ".
    message = e.format_message().replace("Value error, ", "").rstrip(".")
    # Click >= 8.2 suggests a command for a typo, and Typer < 0.26 adds its own.
    message = re.sub(r"( Did you mean [^?]*\?)\1+", r"\1", message)
    ctx = getattr(e, "ctx", None)
    if isinstance(e, click_exc.UsageError) and ctx is not None:
        message = f"{message} (see '{ctx.command_path} --help')"
    fail(message)
    return e.exit_code


def _aborted(e: BaseException) -> int:
    """typer.Abort: Click < 8.2's Ctrl-C (one line, 130), else `imgfilter: aborted`, 1."""
    if isinstance(e.__cause__, KeyboardInterrupt):
        interrupted_line()
        return INTERRUPTED
    print(f"{PROG}: aborted", file=sys.stderr)
    return 1


def _clean_help_params(params: list[Any]) -> list[Any]:
    """Help without Typer's value placeholders where there is no value to give: no
    `<bool>` after flags (-h/--help, --install-completion), no `{INPUT}` or `<path>`
    around an argument's metavar. (Our own flags set metavar="" for the same reason.)"""
    for param in params:
        kind = getattr(param, "param_type_name", "")
        if kind == "option" and getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        elif kind == "argument" and param.metavar:
            param.display_type_rich = _no_type  # Typer >= 0.28
            if hasattr(param, "type"):  # Typer < 0.28 prints <type> unless it is ""
                param.type.get_metavar = _no_metavar
    return params


class _CleanHelp(TyperCommand):
    """A command whose help shows `INPUT`, not `{INPUT}` and `<path>`, and flags such as
    `-h, --help` without `<bool>` (`_clean_help_params`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _clean_help_params(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        # `{INPUT}...` (several inputs) shows as INPUT too; the argument's help says more.
        pieces = [p[:-3] if p[:1] == "{" and p.endswith("}...") else p for p in pieces]
        return [p[1:-1] if p[:1] == "{" and p[-1:] == "}" else p for p in pieces]


def _no_type(*args: Any, **kwargs: Any) -> None:
    return None


def _no_metavar(*args: Any, **kwargs: Any) -> str:
    return ""


app = typer.Typer(
    name=PROG,
    cls=_Commands,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


# Click's and Typer's own ways out of a command, which Click reports itself.
_CLICK_EXITS = (click_exc.ClickException, typer.Exit, typer.Abort)


def help_text(doc: str | None) -> str:
    """A docstring as help: each paragraph of prose on one line, which rich wraps at the
    terminal's width; paragraphs with indented lines (examples) as they are. (Typer
    keeps the line breaks of every paragraph after the first, so a source line longer
    than the terminal would end in a line of a word or two.)"""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(
        p if any(line[:1].isspace() for line in p.splitlines()) else " ".join(p.split("\n"))
        for p in paragraphs
    )


def app_command(name: str) -> Callable[..., Any]:
    """`app.command` with the clean help (`_CleanHelp`, `help_text` of the docstring);
    `name` is a key of `COMMANDS`."""

    def register(fn: Callable[..., Any]) -> Any:
        return app.command(name, cls=_CleanHelp, help=help_text(fn.__doc__))(fn)

    return register


def _version(value: bool) -> None:
    if value:
        print(f"{PROG} {__version__}")
        raise typer.Exit()


def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            metavar="",
            callback=_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """GPU image filters that match OpenCV: box blur, filter2D, contour, Gaussian, edges, sharpen.

    Each command reads an image (PNG, JPEG, TIFF, ...), filters it on the GPU
    (CUDA) or the CPU, and writes INPUT_STEM.OP.EXT beside the input unless -o says
    otherwise. `compare` checks a result against OpenCV and times both.

    Examples:

      imgfilter blur photo.jpg --k 21

      imgfilter filter photo.jpg --kernel "-1,0,1;-2,0,2;-1,0,1" -o edges.png

      imgfilter contour photo.jpg --backend cpu

      imgfilter compare photo.jpg --k 21 --json

    Exit codes: 0 ok, 1 compare disagrees or unexpected error, 2 bad usage,
    3 input problem, 4 output problem, 5 GPU problem (none usable, out of memory, CUDA failure).
    """


app.callback(help=help_text(_main.__doc__))(_main)


def command(fn: Callable[..., Any] | None = None, *, spinner: bool = False) -> Any:
    """Decorator: the command runs through `worker.run_command` (worker thread, Ctrl-C,
    the spinner when `spinner`, one-line errors), its exit status given to Typer. The
    command's `quiet` and `debug` keyword arguments are --quiet and --debug."""
    if fn is None:
        return functools.partial(command, spinner=spinner)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return run_command(
                functools.partial(fn, *args, **kwargs),
                quiet=bool(kwargs.get("quiet")),
                debug=bool(kwargs.get("debug")),
                spinner=spinner,
                passthrough=_CLICK_EXITS,
            )
        except Exit as e:
            raise typer.Exit(e.code) from None

    return wrapper
