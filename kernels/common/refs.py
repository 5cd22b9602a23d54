"""Kernels named without importing the modules that define them.

A `kernels` module that defines kernels imports Numba (about half a second) and
compiles on first use. A `KernelRef` names one of its kernels: a module-level kernel
by its name, or the kernel a factory makes by the factory's name and arguments. The
launch layer (`kernels.common.launch`) runs the kernel's shipped or cached binary by
that name without Numba; only where none exists does `dispatcher` import the module
and hand over the Numba dispatcher, which compiles it.

The same name must come out of the dispatcher once made (`key_of`): a factory is
decorated with `kernel_factory`, which stamps each kernel it makes with its name. So a
factory's arguments are plain values (ints, bools, strings, NumPy dtypes, tuples of
them), never Numba types. Nothing here imports Numba.
"""

from __future__ import annotations

import functools
import importlib
import threading

import numpy as np

from . import shipped

_KEY = "imgfilter_kernel_key"  # the attribute a factory's kernel carries its name in


def stable_text(value) -> str | None:
    """A text that names `value` the same in every process, or None when there is none
    (then the kernel it names is not shipped)."""
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    if isinstance(value, tuple):
        parts = [stable_text(v) for v in value]
        return None if None in parts else "(" + ",".join(parts) + ")"
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name  # np.float32 names what np.dtype("float32") does
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"  # a class, such as int
    return None


def _name(module: str, name: str, args: tuple | None) -> str | None:
    if args is None:
        return f"{module}|{name}"
    text = stable_text(args)
    return None if text is None else f"{module}|{name}|{text}"


def kernel_factory(factory):
    """Decorator of a kernel factory: cached (one kernel per distinct arguments), and
    each kernel it makes stamped with the name a `KernelRef` gives it."""
    made = functools.cache(factory)

    @functools.wraps(factory)
    def make(*args):
        kernel = made(*args)
        key = _name(factory.__module__, factory.__qualname__, args)
        if key is not None and getattr(kernel, _KEY, None) is None:
            setattr(kernel, _KEY, key)
        return kernel

    return make


def key_of(dispatcher) -> str | None:
    """The name of a `kernels` dispatcher's kernel: the one its factory stamped, else a
    module-level kernel's module and name; None for a kernel a factory made without
    `kernel_factory` (its closure is not named) or one outside the package."""
    key = getattr(dispatcher, _KEY, None)
    if key is not None:
        return key
    func = getattr(dispatcher, "py_func", None)
    module = getattr(func, "__module__", None) or ""
    if not module.startswith("kernels.") or module[len("kernels.") :] in shipped.HOST_MODULES:
        return None  # outside the package, or a wrapper the launch layer generates
    if func.__closure__ or "<locals>" in func.__qualname__:
        return None
    return f"{module}|{func.__qualname__}"


class KernelRef:
    """A kernel of the `kernels` package, by name.

    module: the dotted name of the module that defines it (e.g. "kernels.classify");
    name: a module-level kernel's name, or (with `args`) the name of a
    `kernel_factory` in that module, called with `args` to make the kernel. Refs are
    compared by identity: keep one per kernel (`functools.cache` on the function that
    makes them).
    """

    __slots__ = ("module", "name", "args", "function_key", "_dispatcher", "_lock")

    def __init__(self, module: str, name: str, args: tuple | None = None) -> None:
        self.module, self.name, self.args = module, name, args
        self.function_key = _name(module, name, args)
        self._dispatcher = None
        self._lock = threading.Lock()

    @property
    def dispatcher(self):
        """The kernel's Numba dispatcher (importing its module, and so Numba)."""
        if self._dispatcher is None:
            with self._lock:
                if self._dispatcher is None:
                    found = getattr(importlib.import_module(self.module), self.name)
                    self._dispatcher = found if self.args is None else found(*self.args)
        return self._dispatcher

    def __repr__(self) -> str:
        args = "" if self.args is None else repr(self.args)
        return f"KernelRef({self.module}:{self.name}{args})"


def dispatcher_of(kernel):
    """A Numba dispatcher from a dispatcher or a KernelRef."""
    return kernel.dispatcher if type(kernel) is KernelRef else kernel
