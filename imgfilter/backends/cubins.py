"""Compiled kernels kept on disk as cubins, so a later process can launch them without
importing Numba (`imgfilter.backends.cached`). IMGFILTER_DEBUG_CUBINS=1 reports failed
exports on stderr.

The CUDA backend exports a kernel after Numba has compiled and run it (`remember`);
`load` returns it to any process on a GPU of the same compute capability. A file's
name carries the kernel's specialisation, a digest of the `kernels` package sources
and of the numba-cuda version, and the compute capability, so an upgrade or an edit
of a kernel never picks up a stale binary. Writes are atomic; unreadable or foreign
files are ignored. Nothing here imports Numba.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

import kernels
from kernels.cache import cache_dir

_saved: set = set()


def box_name(geometry: dict, channels: int, dtype) -> str:
    """Name of the box_fused specialisation that `kernels.box_plan.plan` chose."""
    sums = np.dtype(geometry["sum_type"]).name
    return f"box_fused-{np.dtype(dtype).name}-{sums}-c{channels}-m{int(geometry['magic_rounding'])}"


def packed_name(geometry: dict, channels: int) -> str:
    """Name of the box_packed specialisation that `kernels.box_plan.packed_plan` chose."""
    g = geometry
    return f"box_packed-c{channels}-r{g['run']}-t{g['threads']}-e{int(g['even'])}"


def tiled_name(geometry: dict, channels: int, ksize: tuple) -> str:
    """Name of the box_tiled specialisation that `kernels.box_plan.tiled_plan` chose
    (`kernels.box_tiled.kernel_for(channels, ksize, geometry)`)."""
    g = geometry
    kh, kw = ksize
    return (
        f"box_tiled-c{channels}-k{kh}x{kw}-t{g['threads']}-r{g['run']}"
        f"-w{g['tile_w']}-h{g['tile_h']}-g{g['groups']}-b{g.get('min_blocks', 0)}"
        + ("-vh" if g.get("vertical_first") else "")
    )


def twopass_names(channels: int, geo: dict) -> tuple[str, str]:
    """Names of box_twopass's row pass for this many channels and the geometry's run,
    and of its column pass (box_column_tiles, or box_column_means)."""
    tiles = f"box_twopass-columns-tiles-w{geo['col_threads']}"
    columns = tiles if geo["col_groups"] else "box_twopass-columns"
    return f"box_twopass-rows-c{channels}-r{geo['run']}", columns


def contour_name(channels: int, dtype) -> str:
    return f"contour-{np.dtype(dtype).name}-c{channels}"


def blocked_name(kh: int, kw: int, dtype) -> str:
    return f"blocked-{np.dtype(dtype).name}-{kh}x{kw}"


def _numba_cuda_version() -> str:
    """numba-cuda's version from its VERSION file (importlib.metadata costs ~80 ms)."""
    spec = importlib.util.find_spec("numba_cuda")
    try:
        root = Path(next(iter(spec.submodule_search_locations)))
        return (root / "VERSION").read_text().strip()
    except (AttributeError, StopIteration, TypeError, OSError):
        return "unknown"


@functools.cache
def _digest() -> str:
    """Hash of the kernels package's sources and the numba-cuda version."""
    h = hashlib.sha256()
    for path in sorted(Path(kernels.__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(_numba_cuda_version().encode())
    return h.hexdigest()[:16]


def _directory() -> Path:
    return cache_dir() / "cubins"


def _path(name: str, cc: tuple[int, int]) -> Path:
    return _directory() / f"{name}-{_digest()}-sm{cc[0]}{cc[1]}.cubin"


def pending_marker(name: str) -> Path:
    """The file that says a process is compiling kernel `name` for the cache."""
    return _directory() / f"{name}-{_digest()}.pending"


def any_for(cc: tuple[int, int]) -> bool:
    """Whether any cubin for this compute capability and these kernel sources exists."""
    try:
        return any(_directory().glob(f"*-{_digest()}-sm{cc[0]}{cc[1]}.cubin"))
    except OSError:
        return False


def load(name: str, cc: tuple[int, int]) -> tuple[bytes, str] | None:
    """(cubin image, entry point name) for a kernel, or None when none is usable."""
    path = _path(name, cc)
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
        image = path.read_bytes()
    except (OSError, ValueError):
        return None
    entry = meta.get("entry") if isinstance(meta, dict) else None
    if not isinstance(entry, str) or not image:
        return None
    return image, entry


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def remember(dispatcher, name: str, array_dtypes: tuple, cc: tuple[int, int]) -> None:
    """Export the cubin of `dispatcher`'s compiled specialisation whose array arguments
    have these dtypes, in order, once per process. Never raises: the cache is only an
    optimisation."""
    key = (name, tuple(cc))
    if key in _saved:
        return
    _saved.add(key)
    try:
        path = _path(name, cc)
        if path.exists() and path.with_suffix(".json").exists():
            return
        wanted = [np.dtype(dt).name for dt in array_dtypes]
        matches = [
            kernel
            for signature, kernel in dispatcher.overloads.items()
            if [str(t.dtype) for t in signature if hasattr(t, "dtype")] == wanted
        ]
        if len(matches) != 1:
            raise LookupError(f"{len(matches)} compiled specialisations take arrays {wanted}")
        library = matches[0]._codelibrary
        image = library.get_cubin(cc=tuple(cc))
        image = getattr(image, "code", image)  # numba-cuda >= 0.2x: a cuda.core ObjectCode
        if isinstance(image, str):  # an ObjectCode may hold a file path instead
            image = Path(image).read_bytes()
        entry = library._entry_name
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, bytes(image))
        _write_atomically(path.with_suffix(".json"), json.dumps({"entry": entry}).encode())
    except Exception as exc:  # noqa: BLE001 - private Numba attributes may change; never fail
        if os.environ.get("IMGFILTER_DEBUG_CUBINS") == "1":
            print(f"imgfilter: cubin export of {name} failed: {exc!r}", file=sys.stderr)
