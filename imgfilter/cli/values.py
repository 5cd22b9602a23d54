"""What the commands' option values are and resolve to, without Typer.

The choices (`Border`, `Backend`, `Method`) and the functions that turn parsed values
into what imgfilter.api takes. `options` declares the Typer options that give them.
"""

from __future__ import annotations

import contextlib
import io as _text_io
import math
from enum import Enum
from typing import Any

from ..backends import BACKENDS
from ..errors import UsageError
from ..names import BLUR_METHODS, BORDER_NAMES, CONTOUR_METHODS, FILTER_METHODS, METHODS
from .output import Run, note

Border = Enum("Border", {name: name for name in BORDER_NAMES}, type=str)
Backend = Enum("Backend", {name: name for name in BACKENDS}, type=str)
Method = Enum("Method", {name: name for name in METHODS}, type=str)


def border_value(border: Border, value: float | None) -> float:
    """--border-value as a float (0 when not given); UsageError unless --border
    constant or when not finite."""
    if value is None:
        return 0.0
    if border.value != "constant":
        raise UsageError(f"--border-value applies to --border constant, not {border.value}")
    if not math.isfinite(value):
        raise UsageError(f"--border-value must be finite, got {value}")
    return float(value)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def gpu_bytes(size: str | None) -> int | None:
    """--max-gpu-memory SIZE in bytes: a positive number with an optional K, M, G or T
    (binary units; a trailing B or iB is allowed); UsageError otherwise."""
    if size is None:
        return None
    text = size.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    number = text[: len(text) - len(unit)]
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 1:
        raise UsageError(f"--max-gpu-memory must be a size such as 2G or 512M, got {size!r}")
    return int(value)


def resolve_backend(backend: Backend) -> str:
    """The backend that will run ("cuda"/"cpu"); DeviceError if cuda cannot.

    For auto without a usable GPU, get_backend notes the CPU fallback on stderr once
    (not with --quiet).
    """
    from ..backends import get_backend

    if Run.quiet:  # the fallback note is informational
        with contextlib.redirect_stderr(_text_io.StringIO()):
            return get_backend(backend.value).NAME
    return get_backend(backend.value).NAME


def check_gpu_first(backend: Backend) -> None:
    """--backend cuda without a usable GPU: DeviceError (exit 5) before any I/O."""
    if backend is Backend.cuda:
        resolve_backend(backend)


_OP_METHODS = {"blur": BLUR_METHODS, "filter2d": FILTER_METHODS, "contour": CONTOUR_METHODS}


def check_method(api_name: str, method: Method) -> None:
    """UsageError unless --method names one of operation `api_name`'s kernels (checked
    before any input is read, as `imgfilter.api` checks it again)."""
    allowed = _OP_METHODS[api_name]
    if method.value not in allowed:
        raise UsageError(f"unknown {api_name} method {method.value!r}; choose one of "
                         f"{', '.join(allowed)}")  # fmt: skip


def note_unused_method(backend_name: str, method: Method) -> None:
    """--method picks among CUDA kernels; say so when the CPU backend runs instead."""
    if backend_name == "cpu" and method.value != "auto":
        note(
            f"--method {method.value} applies to the CUDA backend; "
            "the CPU backend has one implementation"
        )


def engine(backend_name: str, method: Enum) -> str:
    """What ran, as the `wrote` lines say it: `cuda/METHOD` or `cpu`."""
    return f"{backend_name}/{method.value}" if backend_name == "cuda" else backend_name


def parse_kernel(spec: str, normalize: bool) -> Any:
    """--kernel SPEC (a file or a matrix) as an array, divided by its sum with
    --normalize; UsageError or InputError for a bad one."""
    from ..kernelspec import normalize_kernel
    from ..kernelspec import parse_kernel as parse

    k = parse(spec)
    return normalize_kernel(k) if normalize else k
