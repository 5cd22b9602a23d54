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


# The planned box kernels (`kernels.box.launch`): every channel count, both sum types
# and roundings, the plans' default geometries and shrunk ones, both column passes.
BOX_SHAPES = [(40, 70, 1), (40, 70, 3), (40, 70, 4)]


@pytest.mark.parametrize("shape", BOX_SHAPES, ids=lambda s: f"c{s[2]}")
@pytest.mark.parametrize("dtype, ksize", [(np.uint8, (5, 7)), (np.uint16, (3, 3)),
                                          (np.uint16, (17, 31))])  # fmt: skip
def test_box_fused_kernels(shape, dtype, ksize):
    from kernels.box import fused, plan
    from kernels.box import launch as klaunch

    geo = plan.plan(shape, dtype, ksize, run=4)
    ref = klaunch.fused_kernel(geo["sum_type"], shape[2], geo["magic_rounding"])
    _same_key(ref)
    spelt = (np.dtype(geo["sum_type"]).name, np.int64(shape[2]), int(geo["magic_rounding"]))
    assert klaunch.fused_kernel(*spelt) is ref  # one ref however the arguments are spelt
    assert ref.dispatcher is fused.fused_kernel(np.dtype(geo["sum_type"]), shape[2],
                                                geo["magic_rounding"])  # fmt: skip
    assert klaunch.kernel_refs("fused", shape[2], ksize, geo, dtype) == (ref,)


def test_box_fused_sums_only_in_uint16_or_int32():
    from kernels.box import fused

    with pytest.raises(ValueError, match="uint16 or int32"):
        fused.fused_kernel(np.dtype(np.float32), 3, True)


@pytest.mark.parametrize("shape", BOX_SHAPES, ids=lambda s: f"c{s[2]}")
@pytest.mark.parametrize("ksize, geometry", [((3, 3), {}), ((4, 6), dict(threads=8, run=3))])
def test_box_packed_kernels(shape, ksize, geometry):
    from kernels.box import launch as klaunch
    from kernels.box import packed, plan

    geo = plan.packed_plan(shape, np.uint8, ksize, **geometry)
    ref = klaunch.packed_kernel(shape[2], geo["run"], geo["threads"], geo["even"])
    _same_key(ref)
    assert ref is klaunch.packed_kernel(np.int64(shape[2]), geo["run"], geo["threads"],
                                        np.bool_(geo["even"]))  # fmt: skip
    assert ref.dispatcher is packed.packed_kernel(shape[2], geo["run"], geo["threads"],
                                                  geo["even"])  # fmt: skip
    assert klaunch.kernel_refs("packed", shape[2], ksize, geo, np.uint8) == (ref,)


@pytest.mark.parametrize("shape", BOX_SHAPES, ids=lambda s: f"c{s[2]}")
@pytest.mark.parametrize("ksize, geometry", [((3, 3), {}), ((31, 31), {}),
                                             ((5, 7), dict(threads=16, run=4, tile_w=9,
                                                           tile_h=5, min_blocks=0))])  # fmt: skip
def test_box_tiled_kernels(shape, ksize, geometry):
    from kernels.box import launch as klaunch
    from kernels.box import plan, tiled

    geo = plan.tiled_plan(shape, np.uint8, ksize, **geometry)
    (ref,) = klaunch.kernel_refs("tiled", shape[2], list(ksize), geo, np.uint8)
    _same_key(ref)
    sizes = [geo[k] for k in ("threads", "run", "tile_w", "tile_h", "groups", "min_blocks")]
    assert ref is klaunch.tiled_kernel(shape[2], ksize, *sizes)
    assert ref.args == (shape[2], ksize, *sizes)
    assert ref.dispatcher is tiled.tiled_kernel(shape[2], ksize, *sizes)


@pytest.mark.parametrize("shape", BOX_SHAPES, ids=lambda s: f"c{s[2]}")
@pytest.mark.parametrize("ksize, geometry", [((41, 41), {}), ((700, 3), {}),
                                             ((5, 7), dict(run=4, col_threads=8, col_groups=2,
                                                           strip=4))])  # fmt: skip
def test_box_twopass_kernels(shape, ksize, geometry):
    from kernels.box import launch as klaunch
    from kernels.box import plan, twopass

    geo = plan.twopass_plan(shape, np.uint8, ksize, **geometry)
    rows, columns = klaunch.kernel_refs("twopass", shape[2], ksize, geo, np.uint8)
    assert rows is klaunch.twopass_row_kernel(shape[2], geo["run"])
    assert columns is klaunch.twopass_column_kernel(dict(geo))
    _same_key(rows)
    _same_key(columns)
    assert rows.dispatcher is twopass.row_kernel(shape[2], geo["run"])
    if geo["col_groups"]:
        assert columns.dispatcher is twopass.column_tiles_kernel(geo["col_threads"])
    else:
        assert columns is klaunch.box_column_means
        assert columns.dispatcher is twopass.box_column_means


# (method, image, box, plan): what each box launch function launches, against kernel_refs.
LAUNCHED = [
    ("tiled", (20, 30, 3), np.uint8, (5, 5), "tiled_plan"),
    ("packed", (20, 30, 1), np.uint8, (3, 5), "packed_plan"),
    ("fused", (20, 30, 4), np.uint16, (3, 3), "plan"),
    ("twopass", (20, 30, 3), np.uint8, (41, 41), "twopass_plan"),
    ("twopass", (20, 30, 3), np.uint8, (700, 3), "twopass_plan"),  # column means
    ("running", (20, 30, 3), np.float32, (3, 3), None),
    ("running", (20, 30, 1), np.uint8, (3, 3), None),  # float32 staging
    ("running", (20, 30, 3), np.uint8, (3, 5000), None),  # row tile too wide: separable
    ("separable", (20, 30, 3), np.uint8, (3, 3), None),
]


@pytest.mark.parametrize("method, shape, dtype, ksize, planner", LAUNCHED)
def test_kernel_refs_names_what_each_method_launches(monkeypatch, method, shape, dtype, ksize,
                                                     planner):  # fmt: skip
    from numba import cuda

    from kernels.box import dispatch, plan, running
    from kernels.box import launch as klaunch

    launched = []

    def record(kernel, *args):
        launched.append(kernel)

    monkeypatch.setattr(klaunch, "launch", record)
    monkeypatch.setattr(running, "launch", record)
    geo = getattr(plan, planner)(shape, dtype, ksize) if planner else None
    img = cuda.to_device(np.zeros(shape, dtype))
    dispatch.box_by_name(method)(img, ksize, (ksize[0] // 2, ksize[1] // 2), 0, 0)
    want = klaunch.kernel_refs(method, shape[2], ksize, geo, dtype)
    assert tuple(launched) == want and all(type(k) is KernelRef for k in want)
    with pytest.raises(ValueError, match="no box method"):
        klaunch.kernel_refs("auto", shape[2], ksize, geo, dtype)


def test_a_ref_imports_its_module_only_when_asked_and_keeps_its_dispatcher():
    ref = KernelRef("kernels.nowhere", "factory", (2, "a", np.dtype(np.float32), (1, True)))
    assert ref.function_key == "kernels.nowhere|factory|(2,'a',float32,(1,True))"
    with pytest.raises(ModuleNotFoundError):
        dispatcher_of(ref)  # imported only now
    assert dispatcher_of("plain") == "plain"
    assert refs.stable_text((("int", int), ("array", 2), np.float32)) == (
        "(('int',builtins.int),('array',2),float32)"
    )  # a var-shape kernel's kinds (`var_shape.cubin_name`)
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


def test_the_host_modules_of_gemv_softmax_the_box_filters_and_the_classifier_import_no_numba():
    code = (
        "import sys; import kernels.linalg.gemv, kernels.softmax, kernels.box.running, "
        "kernels.box.launch, kernels.box.dispatch, imgfilter.classify.cuda, "
        "imgfilter.classify; print('numba' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
