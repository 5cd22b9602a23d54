"""Compiled kernels kept on disk as cubins, so a later process can launch them without
importing Numba (`imgfilter.backends.cached`). IMGFILTER_DEBUG_CUBINS=1 reports failed
exports on stderr.

Two places hold them:
- the user's kernel cache: the CUDA backend exports a kernel after Numba has compiled
  and run it (`remember`). A file's name carries the kernel's specialisation, a digest
  of the kernel's sources (its module and the `kernels` modules it imports, host-only
  modules aside) with the numba-cuda version, and the compute capability, so an
  upgrade or an edit of a kernel never picks up a stale binary. Writes are atomic;
  unreadable or foreign files are ignored. The var-shape kernels that lists of device
  images run (`kernels.common.var_shape.cubin_name`, "var_shape-<hash>": generated
  source, which Numba's cache cannot keep) are kept here too, checked against the
  sources of every `kernels` module.
- the kernels shipped in the package (`kernels.common.shipped`, built by
  tools/build_cubins.py): size-generic kernels for the GPU generations its manifest
  lists, each valid while its sources are unchanged (the numba-cuda version does not
  matter: the launcher packs the arguments itself).
`load` returns a kernel from either to any process on a GPU of that compute capability.
Nothing here imports Numba.
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

from kernels.common import shipped
from kernels.common.cache import cache_dir

_saved: set = set()


def box_name(geometry: dict, channels: int, dtype) -> str:
    """Name of the box_fused specialisation that `kernels.box.plan.plan` chose."""
    sums = np.dtype(geometry["sum_type"]).name
    return f"box_fused-{np.dtype(dtype).name}-{sums}-c{channels}-m{int(geometry['magic_rounding'])}"


def packed_name(geometry: dict, channels: int) -> str:
    """Name of the box_packed specialisation that `kernels.box.plan.packed_plan` chose."""
    g = geometry
    return f"box_packed-c{channels}-r{g['run']}-t{g['threads']}-e{int(g['even'])}"


def tiled_name(geometry: dict, channels: int, ksize: tuple) -> str:
    """Name of the box_tiled specialisation that `kernels.box.plan.tiled_plan` chose
    (`kernels.box.tiled.kernel_for(channels, ksize, geometry)`)."""
    g = geometry
    kh, kw = ksize
    return (
        f"box_tiled-c{channels}-k{kh}x{kw}-t{g['threads']}-r{g['run']}"
        f"-w{g['tile_w']}-h{g['tile_h']}-g{g['groups']}-b{g.get('min_blocks', 0)}"
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


def conv_tiled_name(dtype) -> str:
    """Name of `kernels.conv.generic.correlate_tiled` on `dtype` images (any kernel size)."""
    return f"conv_tiled-{np.dtype(dtype).name}"


def conv_window_name(dtype) -> str:
    """Name of `kernels.conv.window.correlate_window` on `dtype` images (any kernel size)."""
    return f"conv_window-{np.dtype(dtype).name}"


def _numba_cuda_version() -> str:
    """numba-cuda's version from its VERSION file (importlib.metadata costs ~80 ms)."""
    spec = importlib.util.find_spec("numba_cuda")
    try:
        root = Path(next(iter(spec.submodule_search_locations)))
        return (root / "VERSION").read_text().strip()
    except (AttributeError, StopIteration, TypeError, OSError):
        return "unknown"


# The first word of a cubin's name -> the `kernels` modules its kernel is defined in.
_FAMILY_MODULES = {
    "box_fused": ("box.fused",),
    "box_packed": ("box.packed",),
    "box_tiled": ("box.tiled",),
    "box_twopass": ("box.twopass",),
    "contour": ("contour.kernel",),
    "blocked": ("conv.blocked",),
    "conv_tiled": ("conv.generic",),
    "conv_window": ("conv.window",),
}


def family(name: str) -> str:
    """The kernel family of a cubin name: its first word."""
    return name.split("-", 1)[0]


def family_modules(name: str) -> tuple[str, ...]:
    """The `kernels` modules (dotted names inside the package) the kernel of a cubin
    name is compiled from (all of them for a family not in the table)."""
    modules = _FAMILY_MODULES.get(family(name))
    if modules is None:
        modules = shipped.all_modules()
    return modules


def _digest_of(closure: tuple[str, ...]) -> str:
    """Digest of these `kernels` modules' sources and of the numba-cuda version that
    compiles them (raises OSError when a module is gone)."""
    h = hashlib.sha256(shipped.files_digest(closure).encode())
    h.update(_numba_cuda_version().encode())
    return h.hexdigest()[:16]


@functools.cache
def _digest(family_name: str, directory: Path) -> str:
    """The digest a reader looks for: of the closure that the process which exported
    the family's kernels recorded in `directory` (no parsing of sources: a later
    process pays only for reading them), else of the closure found by parsing them.
    An edit that changes a module's imports changes that module's bytes too, so a
    recorded closure never hides an edit: it only misses, and the export that follows
    records the new closure."""
    recorded = _recorded_closures(directory).get(family_name)
    if isinstance(recorded, list) and all(isinstance(m, str) for m in recorded):
        try:
            return _digest_of(tuple(recorded))
        except OSError:  # a module the record names is gone
            pass
    return _digest_of(_closure(family_name))


def _closure(family_name: str) -> tuple[str, ...]:
    return tuple(shipped.closure(family_modules(family_name)))


def _closures_file(directory: Path) -> Path:
    return directory / "closures.json"


def _recorded_closures(directory: Path) -> dict:
    """family -> closure, as the exporting processes recorded them ({} if unreadable)."""
    try:
        found = json.loads(_closures_file(directory).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _record_closure(directory: Path, family_name: str, closure: tuple[str, ...]) -> None:
    """Keep the family's closure for readers (last writer wins: a record lost to a
    race only costs a reader one parse)."""
    found = _recorded_closures(directory)
    if found.get(family_name) != list(closure):
        found[family_name] = list(closure)
        write_atomically(_closures_file(directory), json.dumps(found, indent=1).encode())
        _digest.cache_clear()


def _directory() -> Path:
    return cache_dir() / "cubins"


def _path(name: str, cc: tuple[int, int], digest: str | None = None) -> Path:
    digest = digest or _digest(family(name), _directory())
    return _directory() / f"{name}-{digest}-sm{cc[0]}{cc[1]}.cubin"


def pending_marker(name: str) -> Path:
    """The file that says a process is compiling kernel `name` for the cache (named
    without the sources' digest, which the first use of a kernel would otherwise
    parse the sources for)."""
    return _directory() / f"{name}.pending"


def any_for(cc: tuple[int, int]) -> bool:
    """Whether any cubin for this compute capability exists, cached or shipped."""
    if shipped.ships_for(cc):
        return True
    try:
        return any(_directory().glob(f"*-sm{cc[0]}{cc[1]}.cubin"))
    except OSError:
        return False


def _read(path: Path, entry: str | None) -> tuple[bytes, str] | None:
    """(image, entry) from a cubin file, the entry from its .json sidecar unless given."""
    try:
        if entry is None:
            meta = json.loads(path.with_suffix(".json").read_text())
            entry = meta.get("entry") if isinstance(meta, dict) else None
        image = path.read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(entry, str) or not image:
        return None
    return image, entry


def load(name: str, cc: tuple[int, int]) -> tuple[bytes, str] | None:
    """(module image, entry point name) for a kernel, or None when none is usable: the
    kernels shipped in the package first (built from these sources), then the user's
    cache, which holds only what the shipped set lacks (`remember`)."""
    found = shipped.load(name, cc)
    if found is None and any(_directory().glob(f"{name}-*-sm{cc[0]}{cc[1]}.cubin")):
        found = _read(_path(name, cc), None)  # (no digest computed where none is cached)
    return found


def compiled_cubin(dispatcher, array_dtypes: tuple, cc: tuple[int, int]) -> tuple[bytes, str]:
    """(cubin image, entry point) of `dispatcher`'s one compiled specialisation whose
    array arguments have these dtypes, in order, built for compute capability `cc`
    (any generation NVVM targets, not only this GPU's). Reads private Numba attributes:
    raises whatever they raise."""
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
    return bytes(image), library._entry_name


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def remember(dispatcher, name: str, array_dtypes: tuple, cc: tuple[int, int]) -> None:
    """Export the cubin of `dispatcher`'s compiled specialisation whose array arguments
    have these dtypes, in order, once per process. Never raises: the cache is only an
    optimisation. A kernel the package ships for this GPU is not cached: the user's
    cache holds only what the shipped set lacks."""
    key = (name, tuple(cc))
    if key in _saved:
        return
    _saved.add(key)
    try:
        if shipped.find(name, tuple(cc)) is not None:
            return
        closure = _closure(family(name))  # parsed: this process compiled, it may differ
        path = _path(name, cc, _digest_of(closure))
        if path.exists() and path.with_suffix(".json").exists():
            _record_closure(path.parent, family(name), closure)
            return
        image, entry = compiled_cubin(dispatcher, array_dtypes, cc)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, image)
        write_atomically(path.with_suffix(".json"), json.dumps({"entry": entry}).encode())
        _record_closure(path.parent, family(name), closure)
    except Exception as exc:  # noqa: BLE001 - private Numba attributes may change; never fail
        if os.environ.get("IMGFILTER_DEBUG_CUBINS") == "1":
            print(f"imgfilter: cubin export of {name} failed: {exc!r}", file=sys.stderr)
