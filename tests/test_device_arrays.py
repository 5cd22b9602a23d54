"""Device arrays in, device arrays out: no host round trip, same values as OpenCV."""

from __future__ import annotations

import numpy as np
import pytest

import imgfilter
from imgfilter.backends import opencv as ref

KERNEL = np.array([[1, -2, 0], [3, 1, -1]], dtype=np.float32)


def _image(shape, dtype=np.uint8, seed=3):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 256, shape).astype(dtype)


def _operations():
    return [
        ("blur", lambda a: imgfilter.blur(a, 3), lambda a: ref.blur(a, 3)),
        ("filter2d", lambda a: imgfilter.filter2d(a, KERNEL), lambda a: ref.filter2d(a, KERNEL)),
        ("contour", lambda a: imgfilter.contour(a), lambda a: ref.contour(a)),
    ]


@pytest.mark.parametrize(
    "name,ours,theirs", _operations(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_numba_device_array_round_trip(name, ours, theirs):
    from numba import cuda

    host = _image((6, 9, 3))
    out = ours(cuda.to_device(host))
    assert not isinstance(out, np.ndarray), "a device input must give a device output"
    got = out.copy_to_host()
    np.testing.assert_array_equal(got, theirs(host))


def test_device_array_2d_keeps_its_shape():
    from numba import cuda

    host = _image((5, 7))
    got = imgfilter.blur(cuda.to_device(host), 3).copy_to_host()
    assert got.shape == (5, 7)
    np.testing.assert_array_equal(got, ref.blur(host, 3))


def test_device_array_with_cpu_backend_is_refused():
    from numba import cuda

    with pytest.raises(imgfilter.UsageError, match="device arrays"):
        imgfilter.blur(cuda.to_device(_image((4, 4))), 3, backend="cpu")


@pytest.mark.gpu
def test_cupy_array_in_cupy_array_out():
    """Results follow the input's library: a CuPy image gives a CuPy array (from CuPy's
    pool), on the first call and on its replays."""
    cp = pytest.importorskip("cupy")
    host = _image((517, 1031, 3))
    for _ in range(3):
        out = imgfilter.filter2d(cp.asarray(host), KERNEL)
        assert isinstance(out, cp.ndarray)
        np.testing.assert_array_equal(out.get(), ref.filter2d(host, KERNEL))


@pytest.mark.gpu
def test_torch_cuda_tensor_in_torch_tensor_out():
    """A torch CUDA tensor gives a torch tensor (torch's allocator, its device), on the
    first call and on replays; 2-D images keep their shape."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    for shape in ((333, 777, 4), (95, 131)):
        host = _image(shape, np.uint8)
        for _ in range(3):
            out = imgfilter.blur(torch.from_numpy(host).cuda(), 21)
            assert isinstance(out, torch.Tensor) and out.is_cuda and out.shape == shape
            assert np.abs(out.cpu().numpy().astype(int) - ref.blur(host, 21)).max() <= 1
        plane = host if host.ndim == 2 else host[..., 0].copy()
        gray = imgfilter.contour(torch.from_numpy(plane).cuda())
        assert isinstance(gray, torch.Tensor)
        np.testing.assert_array_equal(gray.cpu().numpy(), ref.contour(plane))


class _DLPackOnly:
    """A DLPack producer of CUDA memory and nothing else (as a JAX array is seen)."""

    def __init__(self, tensor):
        self._t = tensor

    def __dlpack__(self, **kwargs):
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


@pytest.mark.gpu
def test_dlpack_producers_are_taken_and_results_export_dlpack():
    """Any DLPack producer of CUDA memory is a device image; its result (ours) is
    exported through DLPack without a copy (torch.from_dlpack)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    host = _image((201, 303, 3), seed=9)
    out = imgfilter.filter2d(_DLPackOnly(torch.from_numpy(host).cuda()), KERNEL)
    as_torch = torch.from_dlpack(out)
    assert as_torch.data_ptr() == out.ptr and tuple(as_torch.shape) == host.shape
    np.testing.assert_array_equal(as_torch.cpu().numpy(), ref.filter2d(host, KERNEL))


# ------------------------------------------------------------- out= and stream=

OPS = {
    "blur": lambda a, **kw: imgfilter.blur(a, 3, **kw),
    "filter2d": lambda a, **kw: imgfilter.filter2d(a, KERNEL, **kw),
    "contour": lambda a, **kw: imgfilter.contour(a, **kw),
}
REFS = {
    "blur": lambda a: ref.blur(a, 3),
    "filter2d": lambda a: ref.filter2d(a, KERNEL),
    "contour": lambda a: ref.contour(a),
}


def _to_device(host):
    from numba import cuda

    return cuda.to_device(host)


@pytest.mark.parametrize("name", sorted(OPS))
def test_out_on_the_host_is_written_and_returned(name):
    host = _image((7, 10, 3))
    expected = REFS[name](host)
    out = np.full(expected.shape, 77, expected.dtype)
    got = OPS[name](host, out=out)
    assert got is out
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("name", sorted(OPS))
def test_out_on_the_device_is_written_and_returned(name):
    host = _image((7, 10, 3))
    expected = REFS[name](host)
    out = _to_device(np.full(expected.shape, 77, expected.dtype))
    got = OPS[name](_to_device(host), out=out, stream=0)
    assert got is out
    np.testing.assert_array_equal(out.copy_to_host(), expected)


@pytest.mark.parametrize("name", sorted(OPS))
def test_out_that_overlaps_the_input_is_refused(name):
    host = _image((7, 10, 3))
    h, w = host.shape[:2]
    # The result's shape over the input's own memory.
    view = host.reshape(-1)[: h * w].reshape(h, w) if name == "contour" else host
    with pytest.raises(imgfilter.UsageError, match="overlaps"):
        OPS[name](host, out=view)
    d = _to_device(host)
    with pytest.raises(imgfilter.UsageError, match="overlaps"):
        OPS["blur"](d, out=d)


@pytest.mark.parametrize(
    "out,match",
    [
        (np.zeros((7, 10, 3), np.uint16), "out must be uint8 of shape"),
        (np.zeros((7, 9, 3), np.uint8), "out must be uint8 of shape"),
        (np.zeros((7, 10, 3), np.uint8)[:, ::-1], "C-contiguous"),
        ([[1]], "NumPy array"),
    ],
)
def test_bad_out_is_refused_with_one_line(out, match):
    with pytest.raises(imgfilter.UsageError, match=match):
        imgfilter.blur(_image((7, 10, 3)), 3, out=out)


def test_device_out_for_a_host_image_is_refused():
    host = _image((7, 10, 3))
    with pytest.raises(imgfilter.UsageError, match="NumPy array for a host image"):
        imgfilter.blur(host, 3, out=_to_device(host))
    with pytest.raises(imgfilter.UsageError, match="device array for a device image"):
        imgfilter.blur(_to_device(host), 3, out=np.empty_like(host))


def test_a_stream_that_is_not_one_is_refused():
    with pytest.raises(imgfilter.UsageError, match="stream must be"):
        imgfilter.blur(_to_device(_image((7, 10, 3))), 3, stream="fast")


# ------------------------------------------------------------- on a real GPU


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(OPS))
def test_device_call_returns_while_the_gpu_is_busy(name):
    from kernels.common.cudadrv import driver

    cp = pytest.importorskip("cupy")
    from kernels.common.timing import busy

    host = _image((517, 1031, 3))
    d = cp.asarray(host)
    OPS[name](d)  # compiled and loaded: the timed call only queues
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    token = busy(0.3, stream.ptr)
    out = OPS[name](d, stream=stream)
    assert not driver().idle(stream.ptr), "the call waited for the GPU"
    stream.synchronize()
    np.testing.assert_array_equal(out.get(), REFS[name](host))
    del token


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(OPS))
def test_results_are_right_on_a_cupy_stream(name):
    cp = pytest.importorskip("cupy")
    host = _image((601, 899, 3), seed=5)
    results = []
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(4):  # queued back to back, consumed on the same stream
            d = cp.asarray(np.roll(host, i, axis=0))
            out = OPS[name](d)  # CuPy's current stream, from the array's interface
            results.append(cp.asarray(out).copy())
    stream.synchronize()
    for i, r in enumerate(results):
        np.testing.assert_array_equal(cp.asnumpy(r), REFS[name](np.roll(host, i, axis=0)))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(OPS))
def test_results_are_right_on_a_torch_stream(name):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    host = _image((601, 899, 3), seed=6)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.from_numpy(host).cuda(non_blocking=True)
        expected_shape = REFS[name](host).shape
        out = torch.empty(expected_shape, dtype=torch.uint8, device="cuda")
        got = OPS[name](x, out=out)  # torch's current stream
        assert got is out
        total = out.to(torch.int64).sum()  # consumed in stream order, no sync by us
    stream.synchronize()
    expected = REFS[name](host)
    assert int(total) == int(expected.astype(np.int64).sum())
    np.testing.assert_array_equal(out.cpu().numpy(), expected)


@pytest.mark.gpu
def test_explicit_stream_argument_wins_over_the_arrays():
    cp = pytest.importorskip("cupy")
    from kernels.common.cudadrv import driver
    from kernels.common.timing import busy

    host = _image((300, 400, 3), seed=8)
    d = cp.asarray(host)
    imgfilter.blur(d, 5)  # compiled and loaded: the timed call only queues
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    token = busy(0.3, stream.ptr)
    out = imgfilter.blur(d, 5, stream=stream)
    assert isinstance(out, cp.ndarray)
    assert not driver().idle(stream.ptr)
    stream.synchronize()
    np.testing.assert_array_equal(out.get(), ref.blur(host, 5))
    del token


def _recipes() -> int:
    """How many image operations' recordings `kernels.common.replay` holds."""
    from kernels.common import replay

    return sum(key[0] == "recipe" for key in replay.TABLE)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(OPS))
def test_replayed_calls_agree_with_the_first(name):
    """The first call of a plan records its launches, later ones replay them: other
    images (and outputs) of the same shape must come out right, borders included."""
    cp = pytest.importorskip("cupy")
    for shape in [(301, 517, 3), (64, 64, 1), (7, 1001, 4)]:
        before = _recipes()
        for seed in range(3):
            host = _image(shape, seed=seed)
            got = OPS[name](cp.asarray(host)).get()
            np.testing.assert_array_equal(got.reshape(REFS[name](host).shape), REFS[name](host))
        assert _recipes() == before + 1, "one recording, then replays"


@pytest.mark.gpu
def test_api_replays_keep_calls_with_other_options_apart(monkeypatch):
    """Repeated device calls are replayed (`kernels.common.replay`): alternating kernel
    sizes, borders, kernels, streams and images must each get their own result. (The
    kernels are compiled at once: a stand-in running while one compiles in the
    background is not filed for replay.)"""
    cp = pytest.importorskip("cupy")
    from imgfilter.backends import background
    from kernels.common import replay

    monkeypatch.setattr(background, "ENABLED", False)

    hosts = [_image((123, 457, 3), seed=s) for s in (11, 12)]
    stream = cp.cuda.Stream(non_blocking=True)
    sharpen = np.array([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], np.float32)
    for _ in range(3):
        for host in hosts:
            d = cp.asarray(host)
            for k in (3, 5):
                for border in ("reflect101", "constant"):
                    got = imgfilter.blur(d, k, border=border).get()
                    np.testing.assert_array_equal(got, ref.blur(host, k, border=border))
            for weights in (KERNEL, sharpen):
                got = imgfilter.filter2d(d, weights, stream=stream)
                stream.synchronize()
                np.testing.assert_array_equal(got.get(), ref.filter2d(host, weights))
            gray = imgfilter.contour(cp.asarray(host[:, :, 0].copy())).get()
            np.testing.assert_array_equal(gray, ref.contour(host[:, :, 0]))
    calls = [key for key in replay.TABLE if key[0] == "call"]
    names = [key[1][0] for key in calls if key[2][0][:2] == (123, 457)]
    assert names.count("blur") >= 4 and names.count("filter2d") >= 2 and "contour" in names


@pytest.mark.gpu
def test_api_replays_of_torch_tensors_follow_torch_streams():
    """Repeated calls on torch CUDA tensors take the replay path (`kernels.common.replay`),
    each on torch's current stream: a side stream's work is ordered before the result
    is read on that stream, with no synchronisation by the caller."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    hosts = [_image((211, 307, 3), seed=s) for s in (21, 22, 23)]
    side = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(side):
        for host in hosts:
            x = torch.from_numpy(host).cuda(non_blocking=True)
            y = imgfilter.blur(x, 5)
            assert isinstance(y, torch.Tensor)
            sums.append(y.to(torch.int64).sum())
    side.synchronize()
    for host, total in zip(hosts, sums, strict=True):
        assert int(total) == int(ref.blur(host, 5).astype(np.int64).sum())
    from kernels.common import replay

    calls = [key for key in replay.TABLE if key[0] == "call"]
    assert any(key[2][0] == (211, 307, 3) for key in calls)  # filed for torch


def test_results_are_made_by_the_inputs_library(monkeypatch):
    """`native_empty`: torch's `empty` for a torch tensor, CuPy's for a CuPy array (on
    the array's device), None (our pool) for other arrays."""
    import sys
    import types

    from kernels.common.devarray import DeviceArray, native_empty

    made = []
    torch = types.SimpleNamespace(empty=lambda shape, dtype, device: made.append(
        ("torch", shape, dtype, device)) or "t")  # fmt: skip

    class Device:
        def __enter__(self):
            made.append("device entered")

        def __exit__(self, *exc):
            made.append("device left")

    cupy = types.SimpleNamespace(
        empty=lambda shape, dtype: made.append(("cupy", shape, dtype)) or "c"
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    tensor = type("Tensor", (), {"__module__": "torch", "dtype": "torch.uint8", "device": "cuda:1"})
    array = type("ndarray", (), {"__module__": "cupy._core.core", "device": Device()})
    assert native_empty(tensor(), (4, 5), np.uint8) == "t"
    assert native_empty(array(), (4, 5, 3), np.uint16) == "c"
    assert native_empty(DeviceArray(1 << 30, (4, 5), np.uint8), (4, 5), np.uint8) is None
    assert made == [("torch", (4, 5), "torch.uint8", "cuda:1"), "device entered",
                    ("cupy", (4, 5, 3), np.uint16), "device left"]  # fmt: skip


def test_dlpack_producers_of_cuda_memory_are_device_arrays():
    from kernels.common.arrays import is_device_array

    class Producer:
        def __init__(self, device_type):
            self.device_type = device_type

        def __dlpack__(self, **kwargs):
            raise AssertionError("not read to decide")

        def __dlpack_device__(self):
            return (self.device_type, 0)

    assert is_device_array(Producer(2)) and is_device_array(Producer(13))  # CUDA, managed
    assert not is_device_array(Producer(1))  # host memory
