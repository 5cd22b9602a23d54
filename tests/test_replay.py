"""Repeated device calls replayed by the API (`kernels.common.replay`) and by the kernel
entry points (softmax, gemv): the key separates what must differ, a replay patches
the new addresses, stale or partial records are never filed. A fake driver stands in
for CUDA (tests/test_pool.py), so these run on CI as on a GPU machine."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from test_pool import fake  # noqa: F401 - the fixture

import imgfilter
from imgfilter import api
from kernels.common import launch, replay
from kernels.common.cudadrv import CudaError
from kernels.common.devarray import DeviceArray, peek
from kernels.linalg import gemv
from kernels.softmax import dispatch as softmax

PACKER = struct.Struct("@" + "q" * 11 * 2)  # two 2-D arrays as Numba passes them


def _recipe():
    """One recorded launch whose two arrays are the call's slots 0 and 1."""
    values = [0, 0, 12, 1, 0, 3, 4, 4, 1, 0, 0] * 2
    step = (55, (1, 1, 1), (32, 1, 1), 0, PACKER, values, ((4, 0, 0), (15, 1, 0)))
    return launch.Recipe((step,), (), ())


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.setattr(replay, "TABLE", {})


def _filed(drv, options, img, result, stream=None):
    replay.lookup(options, img, stream)  # a miss: the general path would follow
    replay.note(img, result, _recipe())
    replay.remember(options, img, stream, result)


def test_a_filed_call_is_replayed_on_new_addresses(fake, clean):  # noqa: F811
    drv, pool = fake
    options = ("blur", 3, None, "reflect101", 0.0, "auto", "auto", None)
    first = DeviceArray(1 << 30, (3, 4), np.uint8, stream=7)
    _filed(drv, options, first, pool_array((3, 4), 7))
    other = DeviceArray(5 << 30, (3, 4), np.uint8, stream=7)
    out = replay.lookup(options, other, None)
    assert out is not None and out.shape == (3, 4) and out.dtype == np.uint8
    assert out.stream == 7 and out.ptr != 0
    (fn, _, _, _, stream, values) = drv.launches[-1]
    assert (fn, stream, values[4], values[15]) == (55, 7, 5 << 30, out.ptr)


def pool_array(shape, stream):
    from kernels.common.devarray import empty

    return empty(shape, np.uint8, stream)


@pytest.mark.parametrize(
    "change",
    [
        {"options": ("blur", 5, None, "reflect101", 0.0, "auto", "auto", None)},
        {"shape": (4, 4)},
        {"dtype": np.uint16},
        {"ptr": (1 << 30) + 4},  # another alignment
        {"stream": 8},
    ],
)
def test_anything_the_key_holds_misses(fake, clean, change):  # noqa: F811
    options = ("blur", 3, None, "reflect101", 0.0, "auto", "auto", None)
    _filed(
        fake[0], options, DeviceArray(1 << 30, (3, 4), np.uint8, stream=7), pool_array((3, 4), 7)
    )
    img = DeviceArray(
        change.get("ptr", 3 << 30), change.get("shape", (3, 4)), change.get("dtype", np.uint8),
        stream=change.get("stream", 7),
    )  # fmt: skip
    assert replay.lookup(change.get("options", options), img, None) is None


def test_views_of_one_shape_with_other_strides_miss(fake, clean):  # noqa: F811
    """A recipe holds the strides it was recorded with: a view with other strides
    (columns of a wider image) must not replay it."""
    options = ("blur", 3, None, "reflect101", 0.0, "auto", "auto", None)
    narrow = DeviceArray(1 << 30, (3, 4), np.uint8, strides=(8, 1), stream=7)
    _filed(fake[0], options, narrow, pool_array((3, 4), 7))
    assert replay.lookup(options, DeviceArray(3 << 30, (3, 4), np.uint8, (8, 1), 7), None)
    wider = DeviceArray(3 << 30, (3, 4), np.uint8, strides=(16, 1), stream=7)
    assert replay.lookup(options, wider, None) is None


def test_an_explicit_stream_is_part_of_the_key(fake, clean):  # noqa: F811
    options = ("contour", "reflect101", 0.0, "auto", "auto", None)
    img = DeviceArray(1 << 30, (3, 4), np.uint8, stream=7)
    _filed(fake[0], options, img, pool_array((3, 4), 9), stream=9)
    assert replay.lookup(options, img, None) is None  # the image's own stream, 7
    assert replay.lookup(options, img, 9).stream == 9


def test_stale_notes_and_other_results_are_not_filed(fake, clean):  # noqa: F811
    options = ("blur", 3, None, "reflect101", 0.0, "auto", "auto", None)
    img = DeviceArray(1 << 30, (3, 4), np.uint8, stream=7)
    replay.note(img, pool_array((3, 4), 7), _recipe())  # an earlier call's note
    replay.lookup(options, img, None)  # this call's miss clears it
    replay.remember(options, img, None, pool_array((3, 4), 7))
    assert replay.TABLE == {}
    replay.note(DeviceArray(9 << 30, (3, 4), np.uint8), pool_array((3, 4), 7), _recipe())
    replay.remember(options, img, None, pool_array((3, 4), 7))  # noted on another image
    assert replay.TABLE == {}


def test_unhashable_options_and_host_images_go_the_general_way(fake, clean):  # noqa: F811
    img = DeviceArray(1 << 30, (3, 4), np.uint8, stream=7)
    assert replay.lookup(("filter2d", [[1, 2]]), img, None) is None
    replay.note(img, pool_array((3, 4), 7), _recipe())
    replay.remember(("filter2d", [[1, 2]]), img, None, pool_array((3, 4), 7))
    assert replay.TABLE == {}
    assert replay.lookup(("blur",), np.zeros((3, 4), np.uint8), None) is None
    assert replay.lookup(("blur",), img, "fast") is None  # the general path says why


def test_a_driver_failure_while_replaying_is_a_device_error(fake, clean, monkeypatch):  # noqa: F811
    options = ("blur", 3)
    img = DeviceArray(1 << 30, (3, 4), np.uint8, stream=7)
    _filed(fake[0], options, img, pool_array((3, 4), 7))

    def fail(*args):
        raise CudaError("cuLaunchKernelEx failed: CUDA_ERROR_LAUNCH_FAILED", 719)

    monkeypatch.setattr(launch.Recipe, "replay", fail)
    with pytest.raises(CudaError, match="LAUNCH_FAILED"):
        replay.lookup(options, img, None)
    with pytest.raises(imgfilter.DeviceError, match="LAUNCH_FAILED"):
        api._replayed(options, img, None)  # as the API words it


class _RecordingBackend:
    """A backend whose box queues one recorded launch, as the CUDA backend's does."""

    def __init__(self):
        self.calls = 0

    def box(self, src, ksize, anchor, code, value, method, dst, handle):
        self.calls += 1
        out = pool_array(src.shape, src.stream)
        replay.note(src, out, _recipe())
        return out


def test_blur_replays_a_device_call_it_has_seen(fake, clean, monkeypatch):  # noqa: F811
    drv, _ = fake
    be = _RecordingBackend()
    monkeypatch.setattr(api, "get_backend", lambda *a, **k: be)
    first = imgfilter.blur(DeviceArray(1 << 30, (3, 4), np.uint8, stream=7), 3)
    again = imgfilter.blur(DeviceArray(2 << 30, (3, 4), np.uint8, stream=7), 3)
    assert be.calls == 1 and again.shape == first.shape == (3, 4)
    assert drv.launches[-1][5][4] == 2 << 30
    imgfilter.blur(DeviceArray(2 << 30, (3, 4), np.uint8, stream=7), 5)  # another box
    assert be.calls == 2
    with pytest.raises(imgfilter.UsageError, match="kernel size"):
        imgfilter.blur(DeviceArray(2 << 30, (3, 4), np.uint8, stream=7), 0)


@pytest.mark.parametrize("module", [softmax, gemv])
def test_kernel_entry_points_replay_recorded_calls(fake, module, monkeypatch):  # noqa: F811
    drv, _ = fake
    monkeypatch.setattr(replay, "TABLE", {})
    if module is softmax:
        x = DeviceArray(1 << 30, (2, 6), np.float32, stream=3)
        dy = pool_array((2, 24), 3).view(np.float32).reshape(2, 6)
        replay.keep_call(("softmax call", peek(x)[0], x.ptr & 15, False, "auto", None), dy,
                         _recipe())  # fmt: skip
        got = softmax.softmax(DeviceArray(6 << 30, (2, 6), np.float32, stream=3))
        assert got.shape == (2, 6) and got.dtype == np.float32
        assert drv.launches[-1][5][4] == 6 << 30 and drv.launches[-1][5][15] == got.ptr
    else:
        A = DeviceArray(1 << 30, (4, 8), np.float16, stream=3)
        x = DeviceArray(2 << 30, (8,), np.float16, stream=3)
        dy = pool_array((8,), 3).view(np.float16)
        three = launch.Recipe(((55, (1, 1, 1), (32, 1, 1), 0, PACKER, [0] * 22,
                                ((4, 0, 0), (15, 2, 0))),), (), ())  # fmt: skip
        key = ("gemv call", peek(A)[0], peek(x)[0], A.ptr & 15, x.ptr & 15, "auto")
        replay.keep_call(key, dy, three)
        got = gemv.gemv(DeviceArray(7 << 30, (4, 8), np.float16, stream=3), x)
        assert got.shape == (4,) and drv.launches[-1][5][4] == 7 << 30
        assert drv.launches[-1][5][15] == got.ptr


@pytest.mark.gpu
def test_softmax_and_gemv_replays_are_right_on_a_gpu():
    """Repeated calls (replayed after the first records) on new data, alternating
    options, against float64 NumPy."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(4)
    for _ in range(3):
        for log in (False, True):
            x = rng.standard_normal((37, 1000)).astype(np.float32) * 20
            got = cp.asnumpy(cp.asarray(softmax.softmax(cp.asarray(x), log=log)))
            x64 = x.astype(np.float64) - x.max(axis=1, keepdims=True)
            want = x64 - np.log(np.exp(x64).sum(axis=1, keepdims=True))
            np.testing.assert_allclose(got, want if log else np.exp(want), rtol=2e-5, atol=1e-6)
        A = rng.standard_normal((513, 1031)).astype(np.float16)
        v = rng.standard_normal(1031).astype(np.float16)
        got = cp.asnumpy(cp.asarray(gemv.gemv(cp.asarray(A), cp.asarray(v))))
        want = A.astype(np.float64) @ v.astype(np.float64)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)
    kinds = {key[0] for key in replay.TABLE}
    assert {"softmax call", "gemv call"} <= kinds


@pytest.mark.gpu
def test_repeated_softmax_and_gemv_calls_take_the_replay_path(monkeypatch):
    """After one call of a layout, a call on new CuPy arrays of that layout is a
    replay: the general path is never entered, and the result is right."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 777)).astype(np.float32)
    A = rng.standard_normal((129, 300)).astype(np.float16)
    v = rng.standard_normal(300).astype(np.float16)
    softmax.softmax(cp.asarray(x))
    gemv.gemv(cp.asarray(A), cp.asarray(v))

    def general_path(*args):
        raise AssertionError("the general path ran: the call was not replayed")

    monkeypatch.setattr(softmax, "_softmax", general_path)
    monkeypatch.setattr(gemv, "_gemv", general_path)
    got = cp.asnumpy(cp.asarray(softmax.softmax(cp.asarray(x[::-1].copy()))))
    e = np.exp(x[::-1].astype(np.float64) - x[::-1].max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=2e-5, atol=1e-6)
    got = cp.asnumpy(cp.asarray(gemv.gemv(cp.asarray(A[::-1].copy()), cp.asarray(v))))
    want = A[::-1].astype(np.float64) @ v.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


class _Stream:
    def __init__(self, ptr):
        self.ptr = ptr


class _CupyLike:
    """What `peek` and `cheap_view` read of a CuPy array."""

    def __init__(self, ptr, shape, dtype, strides=None):
        self.data = _Stream(ptr)  # a MemoryPointer: .ptr
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.strides = strides or DeviceArray(0, shape, dtype).strides
        self._c_contiguous = self.strides == DeviceArray(0, shape, dtype).strides


_CupyLike.__module__ = "cupy._core.core"


def test_peek_of_a_cupy_array_matches_its_view(monkeypatch):
    from kernels.common import devarray

    monkeypatch.setattr(devarray, "_CUPY", [lambda: _Stream(77)])
    for strides in (None, (16, 1)):
        a = _CupyLike(5 << 30, (3, 4), np.uint8, strides)
        layout, ptr, stream = peek(a)
        view = devarray.cheap_view(a)
        assert layout == peek(view)[0] and ptr == view.ptr == 5 << 30
        assert stream == view.stream == 77
    assert peek(_CupyLike(1, (3, 4), np.uint8))[0] != peek(_CupyLike(1, (3, 4), np.uint16))[0]
    monkeypatch.setattr(devarray, "_CUPY", [lambda: _Stream(1)])
    assert peek(_CupyLike(1, (3, 4), np.uint8))[2] == 0  # the legacy stream, as handle 0


class _TorchLike:
    def __init__(self, device, stride):
        self.shape, self.dtype, self._device, self._stride = (3, 4), "torch.uint8", device, stride

    def get_device(self):
        return self._device

    def stride(self):
        return self._stride

    def data_ptr(self):
        return 9 << 30


_TorchLike.__module__ = "torch"
_TorchLike.__name__ = "Tensor"


def test_peek_of_torch_tensors(monkeypatch):
    import sys
    import types

    fake_torch = types.ModuleType("torch")
    fake_torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 55)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    layout, ptr, stream = peek(_TorchLike(0, (4, 1)))
    assert (ptr, stream) == (9 << 30, 55)
    assert layout == peek(_TorchLike(0, (4, 1)))[0] != peek(_TorchLike(0, (8, 1)))[0]
    assert peek(_TorchLike(-1, (4, 1))) is None  # a CPU tensor
    assert peek(np.zeros((3, 4))) is None and peek([1, 2]) is None


def test_peek_without_the_stream_does_not_ask_cupy_or_torch(monkeypatch):
    """A call given stream= peeks with with_stream=False: same layout and pointer, and
    neither library's current stream is looked up."""
    import sys
    import types

    from kernels.common import devarray

    def no_lookup(*args):
        raise AssertionError("the current stream was looked up")

    monkeypatch.setattr(devarray, "_CUPY", [no_lookup])
    fake_torch = types.ModuleType("torch")
    fake_torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=no_lookup)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    a, t = _CupyLike(5 << 30, (3, 4), np.uint8), _TorchLike(0, (4, 1))
    for arr, ptr in ((a, 5 << 30), (t, 9 << 30)):
        layout, got_ptr, stream = peek(arr, with_stream=False)
        assert (got_ptr, stream) == (ptr, None)
        monkeypatch.setattr(devarray, "_CUPY", [lambda: _Stream(77)])
        fake_torch._C._cuda_getCurrentRawStream = lambda device: 55
        assert peek(arr)[0] == layout  # the same key part as with the stream
        monkeypatch.setattr(devarray, "_CUPY", [no_lookup])
        fake_torch._C._cuda_getCurrentRawStream = no_lookup
