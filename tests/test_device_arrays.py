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
def test_cupy_array_in_device_array_out():
    cp = pytest.importorskip("cupy")
    host = _image((517, 1031, 3))
    out = imgfilter.filter2d(cp.asarray(host), KERNEL)
    assert hasattr(out, "__cuda_array_interface__")
    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(out)), ref.filter2d(host, KERNEL))


@pytest.mark.gpu
def test_torch_cuda_tensor_in_device_array_out():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    host = _image((333, 777, 4), np.uint8)
    out = imgfilter.blur(torch.from_numpy(host).cuda(), 21)
    got = torch.as_tensor(out, device="cuda").cpu().numpy()
    assert np.abs(got.astype(int) - ref.blur(host, 21)).max() <= 1
