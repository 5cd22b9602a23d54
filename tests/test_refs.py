"""Kernels named without importing Numba (`kernels.common.refs`): each KernelRef's name
must be the one the launch layer gives the dispatcher it stands for, so that a process
finds the same shipped cubin either way; argument types are named as Numba names them."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from kernels.common import launch, refs
from kernels.common.devarray import DeviceArray
from kernels.common.refs import KernelRef, dispatcher_of, kernel_factory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _same_key(ref: KernelRef) -> None:
    dispatcher = ref.dispatcher
    assert ref.function_key is not None, ref
    assert ref.function_key == refs.key_of(dispatcher), ref


CLASSIFY = ("prepare3", "prepare1", "put", "put_hypot", "put_tail", "gather_rows",
            "argmax_rows", "zero_column", "quantize_u8")  # fmt: skip


@pytest.mark.parametrize("name", CLASSIFY)
def test_the_classifiers_kernels(name):
    from imgfilter.classify import cuda

    _same_key(cuda._kernel(name))


PACKED = [(16, 4, 2, True), (8, 2, 4, False), (4, 4, 1, True), (2, 2, 8, True)]
WARP = [(6, 3, np.float32, False), (5, 7, np.float32, True), (4, 100, np.float16, False),
        (3, 1000, np.float32, True)]  # fmt: skip


@pytest.mark.parametrize("nbytes, itemsize, unroll, tree", PACKED)
def test_gemvs_packed_kernels(nbytes, itemsize, unroll, tree):
    from kernels.linalg import gemv, gemv_kernels

    ref = gemv.packed_kernel(nbytes, itemsize, unroll, tree)
    assert ref is gemv.packed_kernel(nbytes, itemsize, unroll, tree)  # one ref per kernel
    _same_key(ref)
    assert ref.dispatcher is gemv_kernels.packed_kernel(nbytes, itemsize, unroll, tree)
    assert gemv.MAX_BLOCK_N == gemv_kernels.MAX_BLOCK_N


def test_gemvs_plain_kernels():
    from kernels.linalg import gemv

    _same_key(gemv.gemv_naive)
    _same_key(gemv.gemv_splitk)


@pytest.mark.parametrize("rows, cols, dtype, log", WARP)
def test_softmaxs_warp_kernels(rows, cols, dtype, log):
    from kernels.softmax import dispatch

    how, ref = dispatch.plan(rows, cols, dtype, log=log)
    assert how.method == "warp" and type(ref) is KernelRef
    _same_key(ref)


@pytest.mark.parametrize("exact32", [True, False])
def test_box_running_kernels(exact32):
    from kernels.box import running

    _same_key(running.row_sums_kernel(exact32))
    for ref in (running.box_rows, running.box_cols, running.box_column_sums):
        _same_key(ref)


def test_a_ref_imports_its_module_only_when_asked_and_keeps_its_dispatcher():
    ref = KernelRef("kernels.nowhere", "factory", (2, "a", np.dtype(np.float32), (1, True)))
    assert ref.function_key == "kernels.nowhere|factory|(2,'a',float32,(1,True))"
    with pytest.raises(ModuleNotFoundError):
        dispatcher_of(ref)  # imported only now
    assert dispatcher_of("plain") == "plain"
    unnamed = KernelRef("kernels.nowhere", "factory", (object(),))
    assert unnamed.function_key is None  # no stable name: never looked up among the shipped


def test_a_factorys_kernels_carry_the_name_a_ref_gives_them():
    made = []

    class Kernel:
        pass

    @kernel_factory
    def factory(n, dtype):
        made.append(n)
        return Kernel()

    first = factory(3, np.float32)
    assert factory(3, np.float32) is first and made == [3]  # one kernel per arguments
    assert refs.key_of(first) == f"{__name__}|{factory.__qualname__}|(3,float32)"
    assert refs.key_of(factory(4, np.dtype(np.uint8))).endswith("|(4,uint8)")


def test_unnamed_closures_are_not_named():
    from numba import cuda

    def make(n):
        @cuda.jit
        def k(x):
            x[0] = n

        return k

    assert refs.key_of(make(1)) is None  # outside the package, and a closure


def _numba_args():
    base = DeviceArray(1 << 20, (6, 8, 3), np.float32)
    column = DeviceArray(1 << 20, (6,), np.float32, strides=(96,))
    return [
        base, DeviceArray(1 << 21, (5,), np.uint8), DeviceArray(1 << 22, (4, 4), np.uint16),
        column, 3, 2.5, True, np.float32(1.5), np.float64(2.0), np.int32(-4), np.uint8(7),
        np.uint32(9), np.int64(5), np.uint64(6), np.bool_(False), np.float16(0.5),
        (1, 2, 3), (1, np.float32(2.0)), (base, 4),
    ]  # fmt: skip


@pytest.mark.parametrize("arg", _numba_args(), ids=lambda a: type(a).__name__)
def test_argument_types_are_named_and_packed_as_numba_does(arg):
    import numba

    class Dispatcher:
        typeof_pyval = staticmethod(numba.typeof)

    ty = launch._numba_type(Dispatcher, arg)
    assert launch.type_name(arg) == str(ty)
    assert launch.type_code(arg) == launch._format(ty)


def test_unknown_argument_types_have_no_name():
    assert launch.type_name(object()) is None
    assert launch.type_name(()) is None
    assert launch.type_name((1, object())) is None
    assert launch.type_name(2**63) is None and launch.type_name(2**63 - 1) == "int64"


def test_the_host_modules_of_gemv_softmax_box_running_and_the_classifier_do_not_import_numba():
    code = (
        "import sys; import kernels.linalg.gemv, kernels.softmax, kernels.box.running, "
        "imgfilter.classify.cuda, imgfilter.classify; print('numba' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
