"""One exception family for imgfilter; the CLI maps each class to an exit code.

Exit codes (docs/design.md): 0 ok, 2 usage, 3 input problem, 4 output problem, 5 device
problem, 130 interrupted.
Every message is one line that names the problem; no traceback is shown unless `--debug`.
"""

from __future__ import annotations


class ImgFilterError(Exception):
    """Base class: a problem the user can fix, reported as one line.

    `cli_message`, when given, is the same problem in the command line's words (an
    option instead of a Python parameter); the CLI shows it instead of the message.
    """

    exit_code = 1

    def __init__(self, message: str = "", *, cli_message: str | None = None) -> None:
        super().__init__(message)
        self.cli_message = cli_message


class UsageError(ImgFilterError, ValueError):
    """A bad option or argument value (kernel size, border name, kernel spec...)."""

    exit_code = 2


class InputError(ImgFilterError):
    """An input that is missing, unreadable, corrupt or of an unsupported kind."""

    exit_code = 3


class OutputError(ImgFilterError):
    """An output that cannot be written, or would overwrite something it must not."""

    exit_code = 4


class DeviceError(ImgFilterError):
    """No usable GPU when one was demanded, or the GPU ran out of memory."""

    exit_code = 5


class GpuMemoryError(DeviceError, MemoryError):
    """The GPU could not give the memory a call needs (the message says how much was
    needed and how much was free)."""
