"""Building the package's optional C extensions for their tests.

`pip install` builds them into the installed package, but the tests import the tree,
where none may be built: `build` compiles one into a temporary folder and loads it,
or skips the test without setuptools or a C compiler (the package then runs without
the extension)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def build(name: str, source: Path, folder: Path) -> ModuleType:
    """The extension module `name` compiled from C `source` into `folder`, loaded."""
    try:
        from setuptools import Distribution, Extension
    except ImportError:  # pragma: no cover - setuptools comes with pip's build
        pytest.skip(f"setuptools is needed to build {name}")
    dist = Distribution({"ext_modules": [Extension(name, [str(source)])]})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib, cmd.build_temp = str(folder), str(folder / "tmp")
    try:
        cmd.ensure_finalized()
        cmd.run()
    except Exception as exc:  # noqa: BLE001 - no compiler: the package does without it
        pytest.skip(f"no C compiler to build {name}: {exc}")
    (built,) = folder.glob(f"{name}*")
    spec = importlib.util.spec_from_file_location(name, built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
