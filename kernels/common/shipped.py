"""Kernels shipped in the package, compiled ahead of time: kernels/prebuilt/.

`tools/build_cubins.py` compiles them on a GPU machine, reproducibly, into one CUDA
fatbin per kernel (`<file>.fatbin`: an uncompressed cubin for each GPU generation the
manifest lists; the driver's module loader picks the GPU's own) and a manifest.json:
`archs` (the generations, "sm90" and the like) and `kernels`: name -> {"entry": the
kernel's symbol, "modules": the `kernels` modules its code comes from, by dotted name
inside the package (e.g. "box.fused"), "closure": those and every `kernels` module
they import, "digest": the digest of the closure's sources when it was built, and
optionally "file": the file its fatbin is stored under when that is another name's};
every file in the folder is manifest.json or a kernel's. A shipped kernel is used only
while that digest still matches the sources (`sources_digest`), so an edited kernel is
compiled again instead of running stale code. Names are the launch layer's ("launch-"
and a hash of the kernel's name and argument types, `launch_name`);
`kernels.common.binaries` looks here first. IMGFILTER_NO_PREBUILT=1 ignores them all.
Nothing here imports Numba.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
from pathlib import Path

KERNELS_DIR = Path(__file__).parent.parent
DIRECTORY = KERNELS_DIR / "prebuilt"
SUFFIX = ".fatbin"  # a shipped kernel's file: its name (`file`, else the kernel's) and this
# Modules that hold no code a kernel is compiled from (launching, memory, caches,
# timing): editing them keeps the shipped kernels valid.
HOST_MODULES = frozenset(
    "common." + m
    for m in (
        "launch",
        "var_shape",
        "arrays",
        "devarray",
        "cudadrv",
        "cache",
        "timing",
        "shipped",
        "refs",
        "binaries",
    )
)


def _kernels_dir() -> Path:
    return KERNELS_DIR


def source_file(module: str) -> Path:
    """The source of `kernels` module `module` (a dotted name inside the package, such
    as "box.fused"): kernels/box/fused.py, or the package's __init__.py."""
    path = _kernels_dir().joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def all_modules() -> tuple[str, ...]:
    """Every module of the `kernels` package, by dotted name, sorted."""
    root = _kernels_dir()
    names = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names.add(".".join(parts))
    return tuple(sorted(names))


def _is_module(module: str) -> bool:
    return bool(module) and source_file(module).is_file()


@functools.cache
def _imports(module: str) -> frozenset[str]:
    """The `kernels` modules that `module` imports (absolute or relative), by dotted name."""
    path = source_file(module)
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return frozenset()
    parts = module.split(".")
    package = parts if path.name == "__init__.py" else parts[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            named = (node.module or "").split(".") if node.module else []
            if node.level:
                if node.level - 1 > len(package):
                    continue
                base = package[: len(package) - (node.level - 1)] + named
            elif named[:1] == ["kernels"]:
                base = named[1:]
            else:
                continue
            stem = ".".join(base)
            for alias in node.names:  # a submodule, else a name defined in `stem`
                sub = f"{stem}.{alias.name}" if stem else alias.name
                found.add(sub if _is_module(sub) else stem)
        elif isinstance(node, ast.Import):
            found.update(a.name[len("kernels.") :] for a in node.names
                         if a.name.startswith("kernels."))  # fmt: skip
    return frozenset(m for m in found if _is_module(m))


def closure(modules: tuple[str, ...]) -> list[str]:
    """`modules` and every `kernels` module they import, transitively, HOST_MODULES aside."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen or module in HOST_MODULES:
            continue
        seen.add(module)
        todo.extend(_imports(module))
    return sorted(seen)


def sources_digest(modules: tuple[str, ...]) -> str:
    """Hash of the sources of `modules` and of what they import (`closure`)."""
    return files_digest(tuple(closure(modules)))


@functools.cache
def files_digest(listed: tuple[str, ...]) -> str:
    """Hash of the sources of the `kernels` modules `listed` (a closure, in order)."""
    h = hashlib.sha256()
    for module in listed:
        h.update(module.encode())
        h.update(source_file(module).read_bytes())
    return h.hexdigest()[:16]


def _entry_digest(entry: dict) -> str | None:
    """The digest of a manifest entry's sources as they are now: of the closure the
    build recorded (no parsing: an edit that changes a module's imports changes that
    module's bytes too), else of the closure found from its modules."""
    listed = entry.get("closure")
    try:
        if isinstance(listed, list) and all(isinstance(m, str) for m in listed):
            return files_digest(tuple(listed))
        modules = entry.get("modules")
        if isinstance(modules, list) and all(isinstance(m, str) for m in modules):
            return sources_digest(tuple(modules))
    except OSError:  # a module the build saw is gone
        return None
    return None


@functools.cache
def manifest() -> dict:
    """The manifest ({} when none ships, it is unreadable, or IMGFILTER_NO_PREBUILT=1)."""
    if os.environ.get("IMGFILTER_NO_PREBUILT") == "1":
        return {}
    try:
        found = json.loads((DIRECTORY / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def ships_for(cc: tuple[int, int]) -> bool:
    """Whether kernels ship for GPUs of this compute capability."""
    return f"sm{cc[0]}{cc[1]}" in manifest().get("archs", [])


def find(name: str, cc: tuple[int, int]) -> tuple[Path, str] | None:
    """(fatbin path, entry point) of shipped kernel `name` for a GPU of this compute
    capability, or None when none ships for it or it was built from other sources."""
    entry = manifest().get("kernels", {}).get(name)
    if not isinstance(entry, dict) or not ships_for(cc):
        return None
    digest = _entry_digest(entry)
    if digest is None or entry.get("digest") != digest:
        return None
    symbol, file = entry.get("entry"), entry.get("file", name)
    if not isinstance(symbol, str) or not isinstance(file, str):
        return None
    return DIRECTORY / f"{file}{SUFFIX}", symbol


def load(name: str, cc: tuple[int, int]) -> tuple[bytes, str] | None:
    """(module image, entry point) of shipped kernel `name` for a GPU of this compute
    capability, or None (see `find`). The image is the kernel's fatbin, which the
    driver loads as it loads a cubin (`cuModuleLoadData`), taking this GPU's cubin."""
    found = find(name, cc)
    if found is None:
        return None
    try:
        image = found[0].read_bytes()
    except OSError:
        return None
    return (image, found[1]) if image else None


def launch_name(key: str, type_names: tuple[str, ...]) -> str:
    """The launch layer's name for one overload: "launch-" and a hash of the kernel
    function's key and its argument types as Numba names them ("array(float32, 2d, C)")."""
    text = key + "|" + ",".join(type_names)
    return "launch-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def module_of(dispatcher) -> str:
    """The `kernels` module (its dotted name inside the package, such as "box.fused") a
    dispatcher's function is defined in."""
    return dispatcher.py_func.__module__[len("kernels.") :]
