"""The correlation and contour kernels named without importing Numba
(`kernels.conv.launch`, `kernels.contour.launch`): each KernelRef's name is the one the
launch layer gives the dispatcher it stands for (`kernels.common.refs.key_of`), so a
process finds the same shipped cubin either way, and the launch modules import no Numba."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from kernels.common import refs
from kernels.common.refs import KernelRef
from kernels.contour import launch as contour_launch
from kernels.conv import launch as conv_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _same_key(ref: KernelRef) -> None:
    dispatcher = ref.dispatcher
    assert ref.function_key is not None, ref
    assert ref.function_key == refs.key_of(dispatcher), ref


MODULE_LEVEL = [
    ("kernels.conv.generic", "correlate_naive"),
    ("kernels.conv.generic", "pad_image"),
    ("kernels.conv.generic", "correlate_valid"),
    ("kernels.conv.generic", "correlate_tiled"),
    ("kernels.conv.window", "correlate_window"),
]


@pytest.mark.parametrize("module, name", MODULE_LEVEL)
def test_the_module_level_correlation_kernels(module, name):
    import importlib

    ref = getattr(conv_launch, name)
    assert type(ref) is KernelRef and (ref.module, ref.name, ref.args) == (module, name, None)
    _same_key(ref)
    assert ref.function_key == f"{module}|{name}"
    assert ref.dispatcher is getattr(importlib.import_module(module), name)


BLOCKED = [(3, 3, False, False), (3, 5, True, False), (5, 3, False, True), (1, 7, True, True),
           (15, 15, False, False), (31, 31, False, True)]  # fmt: skip


@pytest.mark.parametrize("kh, kw, wide, accumulate", BLOCKED)
def test_the_blocked_kernels(kh, kw, wide, accumulate):
    from kernels.conv import blocked

    ref = conv_launch.blocked_kernel(kh, kw, wide, accumulate)
    assert ref is conv_launch.blocked_kernel(np.int32(kh), np.int64(kw), wide, accumulate)
    _same_key(ref)
    want = f"kernels.conv.blocked|kernel_for|({kh},{kw},{wide},{accumulate})"
    assert ref.function_key == want
    assert ref.dispatcher is blocked.kernel_for(kh, kw, wide, accumulate)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_the_contour_kernels(channels):
    from kernels.contour import kernel

    ref = contour_launch.contour_kernel(channels)
    assert ref is contour_launch.contour_kernel(np.int64(channels))  # one ref per kernel
    _same_key(ref)
    assert ref.function_key == f"kernels.contour.kernel|_make_contour_fused|({channels})"
    assert ref.dispatcher is kernel._make_contour_fused(channels)
    assert ref.dispatcher is not contour_launch.contour_kernel(channels % 4 + 1).dispatcher


def test_the_launch_modules_of_conv_and_contour_do_not_import_numba():
    code = (
        "import sys; import kernels.conv.dispatch, kernels.conv.launch, "
        "kernels.contour.launch; print('numba' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
