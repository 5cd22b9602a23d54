"""Kernels named without importing the modules that define them.

A `kernels` module that defines kernels imports Numba (about half a second) and
compiles on first use. A `KernelRef` names one of its kernels as the launch layer's
shipped-kernel names do (`kernels.common.shipped.function_key`: the module, the
qualified name and, for a kernel a factory makes, the values the factory closed over),
so `kernels.common.launch.launch` can run the kernel's shipped cubin without Numba; only
where none ships does `dispatcher` import the module and hand over the Numba dispatcher,
which compiles it. Nothing here imports Numba.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from . import shipped


class Verbatim(str):
    """A cell value given as the text `shipped.stable_text` makes of it (e.g. the name
    of a Numba type, "float32", which cannot be made without importing Numba)."""


def _cell_text(value) -> str | None:
    return str(value) if type(value) is Verbatim else shipped.stable_text(value)


class KernelRef:
    """A kernel of the `kernels` package, by name.

    module: the dotted name of the module the kernel's Python function is defined in
    (e.g. "kernels.classify"); qualname: that function's qualified name (a factory's
    kernel: "factory.<locals>.kernel"); cells: for a factory's kernel, the values it
    closes over, by variable name (every free variable of the kernel function, as its
    factory binds them; a `Verbatim` for a value named by its text); make: returns the
    Numba dispatcher (default: the module's attribute `qualname`). Refs are compared by
    identity: keep one per kernel (`functools.cache` on the function that makes them).
    """

    __slots__ = ("module", "qualname", "cells", "_make", "_dispatcher", "_lock")

    def __init__(self, module: str, qualname: str, cells: dict[str, Any] | None = None,
                 make: Callable[[], Any] | None = None) -> None:  # fmt: skip
        self.module, self.qualname = module, qualname
        self.cells = dict(cells or {})
        self._make = make
        self._dispatcher = None
        self._lock = threading.Lock()

    @property
    def function_key(self) -> str | None:
        """`kernels.common.shipped.function_key` of the kernel's function, computed
        from the name: a function's free variables are its closure's cells, in sorted
        order (CPython's co_freevars)."""
        parts = [self.module, self.qualname]
        parts += [_cell_text(self.cells[name]) for name in sorted(self.cells)]
        return None if None in parts else "|".join(parts)

    @property
    def dispatcher(self):
        """The kernel's Numba dispatcher (importing its module, and so Numba)."""
        if self._dispatcher is None:
            with self._lock:
                if self._dispatcher is None:
                    if self._make is not None:
                        self._dispatcher = self._make()
                    else:
                        module = importlib.import_module(self.module)
                        self._dispatcher = getattr(module, self.qualname)
        return self._dispatcher

    def __repr__(self) -> str:
        return f"KernelRef({self.module}:{self.qualname})"


def dispatcher_of(kernel):
    """A Numba dispatcher from a dispatcher or a KernelRef."""
    return kernel.dispatcher if type(kernel) is KernelRef else kernel
