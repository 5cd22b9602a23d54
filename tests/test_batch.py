"""Batches: a 4-D (N, H, W, C) or 3-D (N, H, W) array, or a list of images of any
sizes, filtered in one call; each result equals filtering that image alone (every
border mode, dtype and channel count), on host and device arrays."""

from __future__ import annotations

import numpy as np
import pytest
from test_binaries import no_device_fixture  # noqa: F401 - the fixture no_device

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
# runs each kernel once for all its images (kernels.common.batching.Batching).
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
    "filter2d (window)": (np.float32,
                          lambda b, **o: imgfilter.filter2d_batch(b, KERNEL, method="window",
                                                                  **o),
                          lambda i, **o: imgfilter.filter2d(i, KERNEL, method="window", **o)),
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
    """The kernels launched from now on (the launch layer's, and the var-shape
    launches of lists, which `kernels.common.var_shape` makes itself)."""
    from kernels.common import batching, launch, var_shape

    counted = []
    real = launch._launch

    def counting(kernel, grid, block, args, stream, smem):
        counted.append(kernel)
        return real(kernel, grid, block, args, stream, smem)

    monkeypatch.setattr(launch, "_launch", counting)
    monkeypatch.setattr(var_shape, "_launch", counting)
    monkeypatch.setattr(batching, "_launch", counting)
    return counted


@pytest.mark.parametrize("index,name", list(enumerate(ONE_LAUNCH_OPS)))
def test_a_device_batch_is_one_launch_per_kernel(monkeypatch, index, name):
    dtype, many, one = ONE_LAUNCH_OPS[name]
    channels, border = (1, 3, 4)[index % 3], BORDERS[index % len(BORDERS)]
    counted = _count_launches(monkeypatch)
    launches = []
    images = _images(3, (8, 16, channels), dtype, seed=3 + channels)
    alone = [one(_device(img), border=border, border_value=7).copy_to_host() for img in images]
    for n in (2, 3):  # the first two images, then all three: each image alone once
        counted.clear()
        got = many(_device(images[:n]), border=border, border_value=7).copy_to_host()
        launches.append(len(counted))
        np.testing.assert_array_equal(got, np.stack(alone[:n]), err_msg=f"{name}, {border}, n={n}")
    assert launches[0] == launches[1], f"{name}: launches for 2 and 3 images: {launches}"


# Sizes that are multiples of nothing, a one-row and a one-column image among them
# (small: the simulator runs every thread in Python).
MIXED = [(7, 23), (5, 17), (13, 9), (1, 30), (11, 1)]


def _mixed(dtype, channels, seed, sizes=MIXED):
    rng = np.random.default_rng(seed)
    hi = 1000 if dtype == np.float32 else np.iinfo(dtype).max
    shapes = [s if channels is None else (*s, channels) for s in sizes]
    return [rng.integers(1, hi, shape).astype(dtype) for shape in shapes]


def _alone_on_device(one, img, **options):
    return one(_device(img), **options).copy_to_host()


# CASES less two (uint8 with one channel is the 2-D case's kernel; float32 with three
# channels the slowest on the simulator), every border mode still met.
LIST_CASES = [c for c in CASES if c[:2] not in ((np.uint8, 1), (np.float32, 3))]
# Three sizes of MIXED's kind, one row and one column among them (a var-shape launch
# runs the largest image's grid for every image: on the simulator, each of its threads).
DEVICE_MIXED = [(5, 17), (1, 19), (7, 1)]


@pytest.mark.parametrize("dtype,channels,border", LIST_CASES)
def test_device_list_of_mixed_sizes_equals_each_image_alone(dtype, channels, border):
    images = _mixed(dtype, channels, seed=len(border) + (channels or 0), sizes=DEVICE_MIXED)
    for name, (many, one) in _ops(border).items():
        if name == "contour" and dtype == np.float32:
            continue
        got = many([_device(i) for i in images])
        assert isinstance(got, list) and len(got) == len(images)
        for img, res in zip(images, got, strict=True):
            expected = one(img)  # the CPU backend's, equal to the device's alone
            assert res.shape == expected.shape, name
            np.testing.assert_array_equal(
                res.copy_to_host(), expected, err_msg=f"{name} {img.shape}"
            )


@pytest.mark.parametrize("backend", ["auto", "cpu"])
def test_host_list_of_mixed_sizes_equals_each_image_alone(backend):
    for dtype, channels in ((np.uint8, 3), (np.uint16, None), (np.float32, 4)):
        images = _mixed(dtype, channels, seed=3)
        for name, (many, one) in _ops("wrap").items():
            if name == "contour" and dtype == np.float32:
                continue
            got = many(images, backend=backend)
            for img, res in zip(images, got, strict=True):
                np.testing.assert_array_equal(res, one(img, backend=backend), err_msg=name)


def test_list_mixing_dtypes_channels_and_kinds():
    """Images of other dtypes and channel counts form their own launches; a list
    holding host and device images goes image by image."""
    rng = np.random.default_rng(4)
    images = [
        rng.integers(1, 255, shape).astype(np.uint8) for shape in [(5, 7, 3), (9, 4, 3), (3, 11)]
    ]
    images.append(rng.integers(1, 999, (6, 5, 4)).astype(np.uint16))
    for name, (many, one) in _ops("reflect101").items():
        got = many([_device(i) for i in images])
        alone = [one(img) for img in images]  # the CPU backend's, equal to the device's alone
        for img, res, want in zip(images, got, alone, strict=True):
            np.testing.assert_array_equal(res.copy_to_host(), want, err_msg=f"{name} {img.shape}")
        mixed = many([images[0], _device(images[1])])
        np.testing.assert_array_equal(mixed[0], alone[0], err_msg=name)
        np.testing.assert_array_equal(mixed[1].copy_to_host(), alone[1], err_msg=name)


# One kernel family each: box_tiled (uint8), box_fused (uint16), running sums (float32,
# two kernels), the register-blocked and window filters, the contour kernel.
LIST_LAUNCH_OPS = {
    "box uint8": (np.uint8, 3, lambda b: imgfilter.blur_batch(b, 3, border="wrap"),
                  lambda i: imgfilter.blur(i, 3, border="wrap")),
    "box uint16": (np.uint16, 1, lambda b: imgfilter.blur_batch(b, (5, 3), border="constant"),
                   lambda i: imgfilter.blur(i, (5, 3), border="constant")),
    "box float32": (np.float32, 1, lambda b: imgfilter.blur_batch(b, 4),
                    lambda i: imgfilter.blur(i, 4)),
    "filter2d blocked": (np.uint16, 3, lambda b: imgfilter.filter2d_batch(b, KERNEL,
                                                                          border="reflect"),
                         lambda i: imgfilter.filter2d(i, KERNEL, border="reflect")),
    "filter2d window": (np.uint8, 1, lambda b: imgfilter.filter2d_batch(b, KERNEL,
                                                                        method="window"),
                        lambda i: imgfilter.filter2d(i, KERNEL, method="window")),
    "contour": (np.uint8, 4, lambda b: imgfilter.contour_batch(b, border="replicate"),
                lambda i: imgfilter.contour(i, border="replicate")),
}  # fmt: skip


@pytest.mark.parametrize("name", list(LIST_LAUNCH_OPS))
def test_a_device_list_of_mixed_sizes_takes_as_many_launches_for_2_as_for_6(monkeypatch, name):
    dtype, channels, many, one = LIST_LAUNCH_OPS[name]
    counted = _count_launches(monkeypatch)
    sizes = [(6, 70), (11, 23), (5, 17), (13, 9), (1, 30), (9, 1)]
    launches = []
    for n in (2, 6):
        images = _mixed(dtype, channels, seed=n, sizes=sizes[:n])
        counted.clear()
        got = many([_device(i) for i in images])
        launches.append(len(counted))
        for img, res in zip(images, got, strict=True):
            np.testing.assert_array_equal(
                res.copy_to_host(), one(img), err_msg=f"{name} {img.shape}"
            )
    assert launches[0] == launches[1] <= 2, f"{name}: launches for 2 and 6 images: {launches}"


def test_device_list_out_is_filled_and_returned():
    images = _mixed(np.uint8, 3, seed=8)
    outs = [_device(np.zeros_like(i)) for i in images]
    got = imgfilter.blur_batch([_device(i) for i in images], 3, out=outs)
    assert got == outs
    for img, res in zip(images, outs, strict=True):  # the CPU backend's, as the device's
        np.testing.assert_array_equal(res.copy_to_host(), imgfilter.blur(img, 3))
    with pytest.raises(imgfilter.UsageError, match="out must be uint8 of shape"):
        imgfilter.blur_batch([_device(images[0])], 3, out=[_device(images[1])])
    with pytest.raises(imgfilter.UsageError, match="contour needs an integer image"):
        imgfilter.contour_batch([_device(np.zeros((4, 4), np.float32))])


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


GPU_LIST_OPS = {
    "box 3 uint8": (np.uint8, 3, lambda b: imgfilter.blur_batch(b, 3),
                    lambda i: imgfilter.blur(i, 3)),
    "box 5 float32 (scratch)": (np.float32, 1, lambda b: imgfilter.blur_batch(b, 5, border="wrap"),
                                lambda i: imgfilter.blur(i, 5, border="wrap")),
    "box 41 uint8 (two passes)": (np.uint8, 4, lambda b: imgfilter.blur_batch(b, 41),
                                  lambda i: imgfilter.blur(i, 41)),
    "filter2d 7x7 uint16": (np.uint16, 3, lambda b: imgfilter.filter2d_batch(b, SEVEN),
                            lambda i: imgfilter.filter2d(i, SEVEN)),
    "contour uint8": (np.uint8, 3, lambda b: imgfilter.contour_batch(b, border="constant"),
                      lambda i: imgfilter.contour(i, border="constant")),
}  # fmt: skip
SEVEN = np.random.default_rng(7).random((7, 7)).astype(np.float32) - 0.25


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_LIST_OPS))
def test_gpu_device_list_of_mixed_sizes_recorded_and_replayed(name):
    """First call (collected and launched), later calls on other arrays of the same
    shapes (a replayed recipe): every result equals the image filtered alone."""
    dtype, channels, many, one = GPU_LIST_OPS[name]
    sizes = [(480, 640), (37, 1001), (1, 300), (300, 1), (129, 65), (720, 1280)]
    for seed in (1, 2, 1):
        images = _mixed(dtype, channels, seed=seed, sizes=sizes)
        got = many([_device(i) for i in images])
        for img, res in zip(images, got, strict=True):
            expected = _alone_on_device(one, img)
            np.testing.assert_array_equal(res.copy_to_host(), expected, err_msg=f"{img.shape}")


@pytest.mark.gpu
def test_gpu_32_frames_of_mixed_sizes_on_a_cupy_stream():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(32)
    sizes = [(int(rng.integers(480, 1081)), int(rng.integers(640, 1921))) for _ in range(32)]
    frames = _mixed(np.uint8, 3, seed=5, sizes=sizes)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        got = imgfilter.blur_batch([cp.asarray(f) for f in frames], 5)
        totals = [cp.asarray(g).astype(cp.int64).sum() for g in got]
    stream.synchronize()
    for frame, res, total in zip(frames, got, totals, strict=True):
        expected = _alone_on_device(imgfilter.blur, frame, k=5)
        np.testing.assert_array_equal(res.copy_to_host(), expected)
        assert int(total) == int(expected.astype(np.int64).sum())


# Many small sizes (narrower than box_tiled's 64-pixel tile, shorter than its 32 rows):
# each one a kernel of its own while the plan fitted the tile to the image.
SMALL = [(1, 1), (3, 50), (7, 5), (12, 63), (31, 2), (20, 33)]


def _tiled_kernels(channels, ksize):
    """The box_tiled kernels named so far for this many channels and this box: the
    `kernels.box.launch.tiled_kernel` refs alive (each kept by its cache), by their
    arguments."""
    import gc

    from kernels.box import launch
    from kernels.common.refs import KernelRef

    return {ref.args for ref in gc.get_objects() if type(ref) is KernelRef
            and ref.module == launch.TILED and ref.args[:2] == (channels, ksize)}  # fmt: skip


def test_many_small_sizes_run_one_box_kernel_on_the_device(monkeypatch):
    """A device list of small images of many sizes runs one launch of one var-shape
    kernel, and the same images alone one box_tiled kernel between them."""
    from kernels.common import var_shape

    images = _mixed(np.uint8, 3, seed=11, sizes=SMALL)
    counted = _count_launches(monkeypatch)
    var_kernels = len(var_shape._var_kernels)
    got = imgfilter.blur_batch([_device(i) for i in images], 5)
    assert len(counted) == 1
    assert len(var_shape._var_kernels) <= var_kernels + 1
    for img, res in zip(images, got, strict=True):
        np.testing.assert_array_equal(res.copy_to_host(), imgfilter.blur(img, 5), str(img.shape))
    for img in images:
        alone = imgfilter.blur(_device(img), 5).copy_to_host()
        np.testing.assert_array_equal(alone, imgfilter.blur(img, 5), str(img.shape))
    assert len(_tiled_kernels(3, (5, 5))) == 1


def test_small_sizes_start_one_background_compile_of_their_box_kernel(no_device, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    """Host images of many small sizes on a GPU without the binary of the box_tiled
    kernel auto picks for them: each runs box_twopass (the stand-in) meanwhile, and one
    detached process compiles the one box_tiled kernel they share, not one per size."""
    from imgfilter.backends import cuda as backend

    spawned = []
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(backend, "SIMULATOR", False)
    monkeypatch.setattr(backend.background, "ENABLED", True)
    monkeypatch.setattr(backend, "_READY", set())
    monkeypatch.setattr(backend, "_PENDING", {})
    monkeypatch.setattr(backend.background.subprocess, "Popen",
                        lambda argv, **kw: spawned.append(argv))  # fmt: skip
    for h, w in [(h, w) for h in (1, 2, 5, 16, 31, 32, 40) for w in (1, 3, 17, 63, 64, 100)]:
        img = no_device.empty((h, w, 3), np.uint8)
        assert backend._box_now(img, (5, 5), (2, 2), 0, 0) == "twopass", (h, w)
    assert len(spawned) == 1 and "c.compile_box('launch-" in spawned[0][-1]
    assert [p.suffix for p in (tmp_path / "cubins").iterdir()] == [".pending"]
    assert no_device.driver.launched == []


def _recording_ops(monkeypatch):
    """Replace what batch.py hands host images to by fakes that note where each image
    went: "cpu list" for the CPU backend's list functions, else the backend the
    single-image function was given (the fakes return zeros of the result's shape)."""
    from imgfilter import batch
    from imgfilter.backends import cpu

    placed = []

    def fake(shape_of):
        def call(img, *args, backend, out=None, stream=None, **kw):
            placed.append(backend)
            return np.zeros(shape_of(img.shape), img.dtype) if out is None else out

        return call

    def fake_list(shape_of):
        def call(imgs, *args, **kw):
            placed.extend(["cpu list"] * len(imgs))
            return [np.zeros(shape_of(i.shape), i.dtype) for i in imgs]

        return call

    monkeypatch.setattr(batch, "blur", fake(lambda s: s))
    monkeypatch.setattr(batch, "filter2d", fake(lambda s: s))
    monkeypatch.setattr(batch, "contour", fake(lambda s: s[:2]))
    monkeypatch.setattr(cpu, "box_list", fake_list(lambda s: s))
    monkeypatch.setattr(cpu, "correlate_list", fake_list(lambda s: s))
    monkeypatch.setattr(cpu, "contour_list", fake_list(lambda s: s[:2]))
    return placed


def test_backend_auto_places_host_batches_by_the_placement_rule(monkeypatch):
    """Host lists and host arrays under backend auto: cheap filters (integer blur,
    contour, filter2d up to 15 taps) of images up to the size limit go to the CPU
    backend's list functions at once; a float32 blur, a 16-tap filter2d, a --method,
    backend cuda and images past the limit image by image to the backend asked for;
    backend cpu takes them all to the CPU."""
    from imgfilter.backends import warmup

    placed = _recording_ops(monkeypatch)
    images = _mixed(np.uint8, 3, seed=2)
    batch = _images(4, (6, 9, 3), np.uint8, seed=2)
    cheap = [lambda b, **o: imgfilter.blur_batch(b, 5, **o), imgfilter.contour_batch,
             lambda b, **o: imgfilter.filter2d_batch(b, np.ones((3, 5)), **o)]  # fmt: skip
    for call in cheap:
        for given in (images, batch):
            placed.clear()
            call(given)
            assert placed == ["cpu list"] * len(given)
    n = len(images)
    costly = [
        (lambda: imgfilter.filter2d_batch(images, np.ones((4, 4))), ["auto"] * n),
        (lambda: imgfilter.blur_batch([i.astype(np.float32) for i in images], 5), ["auto"] * n),
        (lambda: imgfilter.blur_batch(images, 5, method="tiled"), ["auto"] * n),
        (lambda: imgfilter.blur_batch(images, 5, backend="cuda"), ["cuda"] * n),
        (lambda: imgfilter.filter2d_batch(images, np.ones((4, 4)), backend="CPU"),
         ["cpu list"] * n),
    ]  # fmt: skip
    for call, where in costly:
        placed.clear()
        call()
        assert placed == where
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", 13 * 9 * 3)
    monkeypatch.setattr(warmup, "BLUR_ON_CPU_BYTES_PER_CPU", 0)
    placed.clear()
    imgfilter.blur_batch(images, 5)  # (13, 9, 3) at the limit, (7, 23, 3) past it
    assert placed == ["auto"] + ["cpu list"] * 4


def test_host_list_blurs_on_several_threads_equal_opencv(monkeypatch):
    """Images of every size up to 120x120, spread over threads (the thresholds that keep
    small lists on one thread set low): each result equals cv2.blur's, and a
    (H, W, 1) image's keeps its shape."""
    import threading
    import time

    import cv2

    from imgfilter.backends import cpu

    monkeypatch.setattr(cpu, "LIST_BYTES", 1)
    monkeypatch.setattr(cpu, "GIL_BYTES", 1)
    monkeypatch.setattr(cpu, "threads", lambda: 3)
    used = set()
    real = cpu.box

    def box(*args, **kw):
        used.add(threading.get_ident())
        time.sleep(0.002)  # long enough for every thread to take images
        return real(*args, **kw)

    monkeypatch.setattr(cpu, "box", box)  # images cv2.blur cannot take as they are
    rng = np.random.default_rng(6)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 120, (40, 2))]
    for channels in (3, 1, None):
        images = _mixed(np.uint8, channels, seed=6, sizes=sizes)
        got = imgfilter.blur_batch(images, 5)
        for img, res in zip(images, got, strict=True):
            assert res.shape == img.shape
            want = cv2.blur(img, (5, 5))
            np.testing.assert_array_equal(res, want.reshape(img.shape), str(img.shape))
    assert not used
    imgfilter.blur_batch(_mixed(np.uint8, 3, seed=6, sizes=sizes), 5, border="wrap")
    assert len(used) > 1


HOST_LIST_CASES = [
    (dtype, channels, border, k)
    for dtype in (np.uint8, np.uint16, np.float32)
    for channels in (None, 1, 3, 4)
    for border in BORDERS
    for k in (3, (2, 1), (4, 3))
]


@pytest.mark.parametrize("dtype,channels,border,k", HOST_LIST_CASES)
def test_host_list_equals_each_image_alone_and_opencv(monkeypatch, dtype, channels, border, k):
    """blur_batch of a host list (on the CPU backend's list path, over threads, into a
    new array or `out`) equals blur of each image alone, for every dtype, channel
    count, border (constant: 0 and 7) and box (odd, even, the 2-pixel uint8 box
    OpenCV's fixed point rounds apart); and cv2.blur where OpenCV's result is the
    semantics (integer images, borders cv2 applies, not the 2-pixel uint8 box)."""
    import cv2

    from imgfilter.backends import cpu

    monkeypatch.setattr(cpu, "LIST_BYTES", 1)
    monkeypatch.setattr(cpu, "GIL_BYTES", 1)
    images = _mixed(dtype, channels, seed=len(border) + (channels or 0))
    images[0] = np.full_like(images[0], np.iinfo(np.uint8).max if dtype == np.uint8 else 9)
    cv_border = {"reflect101": 4, "reflect": 2, "replicate": 1, "constant": 0}.get(border)
    kw, kh = (k, k) if isinstance(k, int) else k
    for value in (0, 7) if border == "constant" else (0,):
        opts = dict(border=border, border_value=value, backend="cpu")
        got = imgfilter.blur_batch(images, k, **opts)
        outs = [np.zeros_like(i) for i in images]
        assert imgfilter.blur_batch(images, k, out=outs, **opts) == outs
        for img, res, out in zip(images, got, outs, strict=True):
            alone = imgfilter.blur(img, k, border=border, border_value=value, backend="cpu")
            assert res.shape == img.shape
            np.testing.assert_array_equal(res, alone, str(img.shape))
            np.testing.assert_array_equal(out, alone, str(img.shape))
            opencv = cv_border is not None and dtype != np.float32 and value == 0
            if opencv and not (dtype == np.uint8 and kh * kw == 2):
                want = cv2.blur(img, (kw, kh), borderType=cv_border).reshape(img.shape)
                np.testing.assert_array_equal(res, want, str(img.shape))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_host_contour_and_filter2d_lists_over_threads_equal_each_alone(monkeypatch, dtype):
    """contour_batch and filter2d_batch of host lists over threads (Numba loaded or
    not for contour: one thread in its pass at a time, the others through OpenCV;
    filter2d kernels from OpenCV's direct limit one image at a time) equal each image
    alone."""
    from imgfilter.backends import cpu

    monkeypatch.setattr(cpu, "LIST_BYTES", 1)
    monkeypatch.setattr(cpu, "GIL_BYTES", 1)
    monkeypatch.setattr(cpu, "CONTOUR_GIL_BYTES", 1)
    monkeypatch.setattr(cpu, "threads", lambda: 3)
    rng = np.random.default_rng(8)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 40, (24, 2))]
    big = rng.random((13, 11)).astype(np.float32) - 0.3  # 143 taps: past the limit
    for channels in (None, 1, 3, 4):
        images = _mixed(dtype, channels, seed=channels or 0, sizes=sizes)
        for numba in (False, True):
            monkeypatch.setattr(cpu, "_numba_loaded", lambda numba=numba: numba)
            got = imgfilter.contour_batch(images, border="replicate")
            for img, res in zip(images, got, strict=True):
                np.testing.assert_array_equal(res, imgfilter.contour(img, border="replicate",
                                                                     backend="cpu"))  # fmt: skip
        for kernel in (KERNEL, big):
            got = imgfilter.filter2d_batch(images, kernel, border="wrap", backend="cpu")
            for img, res in zip(images, got, strict=True):
                alone = imgfilter.filter2d(img, kernel, border="wrap", backend="cpu")
                np.testing.assert_array_equal(res, alone)


def test_var_shape_slots_place_an_image_given_twice():
    """A list holding one image twice is placed image by image (it used to make the
    recipe unusable, so every call of it collected its launches again)."""
    from kernels.common.devarray import DeviceArray
    from kernels.common.var_shape import _Slots

    a, b = DeviceArray(1 << 20, (4, 8, 3), np.uint8), DeviceArray(1 << 21, (2, 2, 1), np.uint8)
    outs = [DeviceArray((3 << 20) + 256 * i, (4, 8, 3), np.uint8) for i in range(3)]
    slots = _Slots([(a, outs[0], []), (b, outs[1], []), (a, outs[2], [])])
    assert slots.given == [1, 2, 3, 4, 5, 6]
    assert slots.placer(0)(a.ptr + 4) == (1, 4)
    assert slots.placer(2)(a.ptr + 4) == (5, 4)  # its own slot, not the first image's
    assert slots.placer(2)(outs[2].ptr) == (6, 0)
    assert slots.placer(1)(a.ptr) is False  # another image's memory
    assert slots.placer(None)(b.ptr + 3) is False
    assert slots.placer(None)(b.ptr + 4) is None and slots.placer(1)(1 << 19) is None


@pytest.mark.gpu
def test_gpu_list_holding_an_image_twice_is_replayed(monkeypatch):
    from imgfilter.backends import cuda_lists

    images = _mixed(np.uint8, 3, seed=3, sizes=[(40, 70), (5, 9), (33, 2)])
    devices = [_device(i) for i in images]
    twice = [devices[0], devices[1], devices[0], devices[2], devices[1]]
    collected, real = [], cuda_lists._collect_and_run

    def collect(items, handle):
        collected.append(len(items))
        return real(items, handle)

    monkeypatch.setattr(cuda_lists, "_collect_and_run", collect)
    for _ in range(3):
        got = imgfilter.blur_batch(twice, 5)
        for src, res in zip([images[i] for i in (0, 1, 0, 2, 1)], got, strict=True):
            np.testing.assert_array_equal(res.copy_to_host(), imgfilter.blur(src, 5, backend="cpu"))
    assert collected == [5]  # collected and recorded once, replayed twice


@pytest.mark.gpu
def test_gpu_later_process_loads_the_var_shape_kernel_from_the_cache(tmp_path):
    """The var-shape kernel a list runs is compiled in the first process and exported;
    a later process with the same kernel cache loads it without compiling."""
    import os
    import subprocess
    import sys
    import textwrap

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = textwrap.dedent("""
        import numpy as np
        import imgfilter
        from kernels.common import batching, launch, var_shape
        from numba import cuda
        compiled, real = [], launch.dispatcher_of
        def counting(kernel):  # asked for the dispatcher where no binary is found
            if kernel in var_shape._var_sources:
                compiled.append(kernel)
            return real(kernel)
        launch.dispatcher_of = counting
        rng = np.random.default_rng(1)
        images = [rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8)
                  for h, w in rng.integers(1, 90, (30, 2))]
        got = imgfilter.blur_batch([cuda.to_device(i) for i in images], 5)
        for img, res in zip(images, got):
            assert (res.copy_to_host() == imgfilter.blur(img, 5, backend="cpu")).all()
        print(len(compiled))
        """)  # fmt: skip
    env = {**os.environ, "IMGFILTER_CACHE_DIR": str(tmp_path), "NUMBA_ENABLE_CUDASIM": "0",
           "IMGFILTER_NO_PREBUILT": "1", "IMGFILTER_BACKGROUND_COMPILE": "0",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, cwd=root, timeout=600) for _ in range(2)]  # fmt: skip
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert [r.stdout.strip() for r in runs] == ["1", "0"]
    assert any((tmp_path / "cubins").glob("var_shape-*.cubin"))
