"""Batches: a 4-D (N, H, W, C) or 3-D (N, H, W) array, or a list of images of any
sizes, filtered in one call; each result equals filtering that image alone (every
border mode, dtype and channel count), on host and device arrays."""

from __future__ import annotations

import numpy as np
import pytest

import imgfilter

KERNEL = np.array([[0.5, -1.25, 0], [2, 1, -1]], dtype=np.float32)
BORDERS = ("reflect101", "reflect", "replicate", "constant", "wrap")


def _images(n, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    hi = 1000 if dtype == np.float32 else np.iinfo(dtype).max
    return rng.integers(1, hi, (n, *shape)).astype(dtype)


def _ops(border):
    kw = {"border": border, "border_value": 7}
    return {
        "blur": (lambda b, **o: imgfilter.blur_batch(b, 3, **kw, **o),
                 lambda i, **o: imgfilter.blur(i, 3, **kw, **o)),
        "filter2d": (lambda b, **o: imgfilter.filter2d_batch(b, KERNEL, **kw, **o),
                     lambda i, **o: imgfilter.filter2d(i, KERNEL, **kw, **o)),
        "contour": (lambda b, **o: imgfilter.contour_batch(b, **kw, **o),
                    lambda i, **o: imgfilter.contour(i, **kw, **o)),
    }  # fmt: skip


# Every dtype with every channel count, the border modes taken in turn (each one
# meets several dtypes and channel counts).
CASES = [
    (dtype, channels, BORDERS[i % len(BORDERS)])
    for i, (dtype, channels) in enumerate(
        (d, c) for d in (np.uint8, np.uint16, np.float32) for c in (None, 1, 3, 4)
    )
]


def _device(host):
    from numba import cuda

    return cuda.to_device(host)


@pytest.mark.parametrize("dtype,channels,border", CASES)
@pytest.mark.parametrize("where", ["host", "device"])
def test_array_batch_equals_each_image_alone(dtype, channels, border, where):
    shape = (6, 9) if channels is None else (6, 9, channels)
    batch = _images(3, shape, dtype, seed=channels or 0)
    for name, (many, one) in _ops(border).items():
        if name == "contour" and dtype == np.float32:
            continue
        if where == "host":
            got = many(batch)
        else:
            got = many(_device(batch)).copy_to_host()
        expected = np.stack([one(batch[i]) for i in range(len(batch))])
        np.testing.assert_array_equal(got, expected, err_msg=name)


# (8, 16) images: every image's plane a multiple of 16 bytes, so a device batch
# runs each kernel once for all its images (kernels.launch.Batching).
ONE_LAUNCH_OPS = {
    "box (uint8: tiled)": (np.uint8, lambda b, **o: imgfilter.blur_batch(b, 3, **o),
                           lambda i, **o: imgfilter.blur(i, 3, **o)),
    "box (uint16: fused)": (np.uint16, lambda b, **o: imgfilter.blur_batch(b, (5, 3), **o),
                            lambda i, **o: imgfilter.blur(i, (5, 3), **o)),
    "box (float32: running sums)": (np.float32, lambda b, **o: imgfilter.blur_batch(b, 4, **o),
                                    lambda i, **o: imgfilter.blur(i, 4, **o)),
    "filter2d (blocked)": (np.uint8,
                           lambda b, **o: imgfilter.filter2d_batch(b, KERNEL, method="blocked",
                                                                   **o),
                           lambda i, **o: imgfilter.filter2d(i, KERNEL, method="blocked", **o)),
    "filter2d (separable)": (np.uint16,
                             lambda b, **o: imgfilter.filter2d_batch(b, OUTER, method="separable",
                                                                     **o),
                             lambda i, **o: imgfilter.filter2d(i, OUTER, method="separable",
                                                               **o)),
    "contour": (np.uint8, lambda b, **o: imgfilter.contour_batch(b, **o),
                lambda i, **o: imgfilter.contour(i, **o)),
}  # fmt: skip
OUTER = np.outer([1, 2, 1], [0.25, 1, 2, -1]).astype(np.float32)


def _count_launches(monkeypatch):
    from kernels import launch

    counted = []
    real = launch._launch

    def counting(kernel, grid, block, args, stream, smem):
        counted.append(kernel)
        return real(kernel, grid, block, args, stream, smem)

    monkeypatch.setattr(launch, "_launch", counting)
    return counted


@pytest.mark.parametrize("index,name", list(enumerate(ONE_LAUNCH_OPS)))
def test_a_device_batch_is_one_launch_per_kernel(monkeypatch, index, name):
    dtype, many, one = ONE_LAUNCH_OPS[name]
    channels, border = (1, 3, 4)[index % 3], BORDERS[index % len(BORDERS)]
    counted = _count_launches(monkeypatch)
    launches = []
    for n in (2, 3):
        batch = _images(n, (8, 16, channels), dtype, seed=n + channels)
        counted.clear()
        got = many(_device(batch), border=border, border_value=7).copy_to_host()
        launches.append(len(counted))
        expected = np.stack([
            one(_device(batch[i]), border=border, border_value=7).copy_to_host()
            for i in range(n)
        ])  # fmt: skip
        np.testing.assert_array_equal(got, expected, err_msg=f"{name}, {border}, n={n}")
    assert launches[0] == launches[1], f"{name}: launches for 2 and 3 images: {launches}"


@pytest.mark.parametrize("where", ["host", "device"])
def test_list_of_mixed_sizes(where):
    rng = np.random.default_rng(4)
    images = [
        rng.integers(1, 255, shape).astype(np.uint8) for shape in [(5, 7, 3), (9, 4, 3), (3, 11)]
    ]
    for name, (many, one) in _ops("reflect101").items():
        given = images if where == "host" else [_device(i) for i in images]
        got = many(given)
        assert isinstance(got, list) and len(got) == 3
        for img, res in zip(images, got, strict=True):
            res = res if where == "host" else res.copy_to_host()
            np.testing.assert_array_equal(res, one(img), err_msg=name)


def test_out_is_filled_and_returned():
    batch = _images(4, (5, 6, 3), np.uint8, seed=9)
    out = np.zeros_like(batch)
    assert imgfilter.blur_batch(batch, 3, out=out) is out
    np.testing.assert_array_equal(out, np.stack([imgfilter.blur(b, 3) for b in batch]))
    outs = [np.zeros_like(b) for b in batch]
    assert imgfilter.blur_batch(list(batch), 3, out=outs) == outs
    dev_out = _device(np.zeros_like(batch))
    assert imgfilter.blur_batch(_device(batch), 3, out=dev_out) is dev_out
    np.testing.assert_array_equal(dev_out.copy_to_host(), out)


@pytest.mark.parametrize(
    "images,match",
    [
        (np.zeros((4, 4), np.uint8), "3-D .N, H, W. or 4-D"),
        (np.zeros((0, 4, 4), np.uint8), "empty"),
        (np.zeros((2, 4, 4, 2), np.uint8), "1, 3 or 4 channels"),
    ],
)
def test_bad_batches_are_refused(images, match):
    with pytest.raises(imgfilter.UsageError, match=match):
        imgfilter.blur_batch(images, 3)


def test_bad_batch_out_is_refused():
    batch = _images(2, (4, 5), np.uint8, seed=1)
    with pytest.raises(imgfilter.UsageError, match="out must be uint8 of shape"):
        imgfilter.blur_batch(batch, 3, out=np.zeros((3, 4, 5), np.uint8))
    with pytest.raises(imgfilter.UsageError, match="list of as many"):
        imgfilter.blur_batch(list(batch), 3, out=[np.zeros((4, 5), np.uint8)])


@pytest.mark.gpu
def test_cupy_batch_of_frames_on_a_stream():
    cp = pytest.importorskip("cupy")
    frames = _images(8, (180, 320, 3), np.uint8, seed=12)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        got = imgfilter.blur_batch(cp.asarray(frames), 5)
        total = cp.asarray(got).astype(cp.int64).sum()
    stream.synchronize()
    expected = np.stack([imgfilter.blur(f, 5) for f in frames])
    np.testing.assert_array_equal(got.copy_to_host(), expected)
    assert int(total) == int(expected.astype(np.int64).sum())
