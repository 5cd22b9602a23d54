"""Compiled kernels by name, from the one place that holds each: the kernels shipped in
the package (`kernels.common.shipped`), else the user's kernel cache.

The launch layer (`kernels.common.launch`) names every overload it launches
(`shipped.launch_name`, or `var_shape.cubin_name` for a list's merged kernels) and looks
it up here before compiling; after a compile by Numba it exports the binary here
(`remember`), so a later process launches it without importing Numba. The cache holds
only what the shipped set lacks. A cached binary is `<name>-sm<XY>.cubin` beside a
`.json` sidecar naming its entry point, the `kernels` modules it was compiled from
(`shipped.closure`) and the digest of their sources and of the numba-cuda version that
compiled it: an edited kernel, or another numba-cuda, is compiled again, never run
stale. Writes are atomic; unreadable or foreign files are ignored. A `.pending`
marker says a detached process is compiling that kernel (`imgfilter.backends.background`).
IMGFILTER_DEBUG_CUBINS=1 reports failed exports on stderr. Nothing here imports Numba.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from . import shipped
from .cache import cache_dir

_saved: set = set()


def directory() -> Path:
    """The folder of the user's cached kernel binaries."""
    return cache_dir() / "cubins"


@functools.cache
def _numba_cuda_version() -> str:
    """numba-cuda's version from its VERSION file (importlib.metadata costs ~80 ms)."""
    spec = importlib.util.find_spec("numba_cuda")
    try:
        root = Path(next(iter(spec.submodule_search_locations)))
        return (root / "VERSION").read_text().strip()
    except (AttributeError, StopIteration, TypeError, OSError):
        return "unknown"


def _digest(closure: tuple[str, ...]) -> str:
    """Digest of these `kernels` modules' sources and of the numba-cuda version that
    compiles them (raises OSError when a module is gone)."""
    h = hashlib.sha256(shipped.files_digest(closure).encode())
    h.update(_numba_cuda_version().encode())
    return h.hexdigest()[:16]


def _path(name: str, cc: tuple[int, int]) -> Path:
    return directory() / f"{name}-sm{cc[0]}{cc[1]}.cubin"


def pending_marker(name: str) -> Path:
    """The file that says a detached process is compiling kernel `name`."""
    return directory() / f"{name}.pending"


def _cached(name: str, cc: tuple[int, int]) -> tuple[bytes, str] | None:
    path = _path(name, cc)
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
        closure, entry = tuple(meta["closure"]), meta["entry"]
        if not isinstance(entry, str) or meta["digest"] != _digest(closure):
            return None
        image = path.read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (image, entry) if image else None


def load(name: str, cc: tuple[int, int]) -> tuple[bytes, str] | None:
    """(module image, entry point) of kernel `name` for a GPU of compute capability
    `cc`: shipped (built from these sources), else cached by an earlier compile; None
    when neither holds a usable one."""
    return shipped.load(name, cc) or _cached(name, cc)


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def remember(name: str, cc: tuple[int, int], binary, modules: tuple[str, ...]) -> None:
    """Keep the compiled kernel `name` for later processes, once per process: binary()
    -> (cubin image, entry point) for `cc`, compiled from the `kernels` modules `modules`
    (dotted names inside the package; their imports are followed). Nothing is kept for
    a kernel that ships. Never raises: the cache is only an optimisation."""
    if (name, cc) in _saved:
        return
    _saved.add((name, cc))
    try:
        if shipped.find(name, cc) is not None:
            return
        closure = tuple(shipped.closure(modules))
        meta = {"closure": list(closure), "digest": _digest(closure)}
        path = _path(name, cc)
        image, meta["entry"] = binary()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, image)
        write_atomically(path.with_suffix(".json"), json.dumps(meta).encode())
    except Exception as exc:  # noqa: BLE001 - Numba's private attributes may change; never fail
        if os.environ.get("IMGFILTER_DEBUG_CUBINS") == "1":
            print(f"imgfilter: export of kernel {name} failed: {exc!r}", file=sys.stderr)


def any_cached() -> bool:
    """Whether an earlier compile left any kernel binary in the user's cache."""
    try:
        return any(name.endswith(".cubin") for name in os.listdir(directory()))
    except OSError:
        return False
