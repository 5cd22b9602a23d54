"""The layers of `kernels` (README's Architecture): one package per operation over
`kernels.common`, which imports none of them; operation packages do not import one
another nor borrow another module's private names; the planners the quick start
uses stay free of Numba; nothing in `kernels` imports `imgfilter` or `benchmarks`.

Imports are read from the sources (`kernels.common.shipped`'s resolver, which the
shipped kernels' digests rely on too), so imports inside functions count.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from kernels.common import shipped

ROOT = Path(__file__).resolve().parents[1]
OPERATIONS = ("box", "conv", "contour", "softmax", "linalg", "classify")


def _layer(module: str) -> str:
    return module.split(".")[0]


def test_every_kernels_module_belongs_to_a_layer():
    layers = {_layer(m) for m in shipped.all_modules()}
    assert layers == {"common", *OPERATIONS}


def test_the_import_resolver_sees_relative_absolute_and_function_level_imports():
    imports = shipped._imports("box.dispatch")
    assert {"box.plan", "box.launch", "box.running", "common.arrays"} <= imports
    assert "conv.launch" in shipped._imports("conv.dispatch")
    assert "common.timing" in shipped._imports("linalg.gemv")  # imported inside autotune
    assert shipped._imports("softmax") == {"softmax.dispatch"}


def test_common_imports_no_operation_package():
    for module in shipped.all_modules():
        if _layer(module) == "common":
            outside = {m for m in shipped._imports(module) if _layer(m) != "common"}
            assert not outside, f"kernels.{module} imports {sorted(outside)}"


def test_operation_packages_use_only_themselves_and_common():
    for module in shipped.all_modules():
        if _layer(module) in OPERATIONS:
            allowed = {_layer(module), "common"}
            others = {m for m in shipped._imports(module) if _layer(m) not in allowed}
            assert not others, f"kernels.{module} imports {sorted(others)}"


def _private_names_imported(path: Path) -> list[str]:
    """`from <a kernels module> import _name`: a private name borrowed from another module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or node.module.startswith("kernels")):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_operation_modules_borrow_no_private_names():
    for module in shipped.all_modules():
        if _layer(module) in OPERATIONS:
            borrowed = _private_names_imported(shipped.source_file(module))
            assert not borrowed, f"kernels.{module} imports private names {borrowed}"


def test_kernels_imports_neither_imgfilter_nor_benchmarks():
    for module in shipped.all_modules():
        tree = ast.parse(shipped.source_file(module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module]
            else:
                continue
            bad = [n for n in names if n.split(".")[0] in ("imgfilter", "benchmarks")]
            assert not bad, f"kernels.{module} imports {bad}"


def test_the_quick_starts_planners_import_no_numba():
    code = (
        "import sys, kernels.box.plan, kernels.conv.plan, kernels.contour.plan, "
        "kernels.common.launch; print('numba' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert done.stdout.strip() == "False", done.stderr
