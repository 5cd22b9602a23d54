"""imgfilter.dask (issue 27): a dask array filtered chunk by chunk equals the
whole-image imgfilter result bit for bit, for every border mode, odd and irregular
chunkings, off-centre anchors and kernels larger than a chunk (CPU backend; a small
run on the CUDA backend; CuPy chunks on a real GPU)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest

import imgfilter
from imgfilter.errors import UsageError

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
ifd = importlib.import_module("imgfilter.dask")

BORDERS = ("reflect101", "reflect", "replicate", "constant", "wrap")
DTYPES = (np.uint8, np.uint16, np.float32)


def image(shape, dtype, seed: int) -> np.ndarray:
    """Random data over the dtype's range (float32: mixed signs and magnitudes)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.float32:
        return (rng.standard_normal(shape) * 100).astype(np.float32)
    return rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)


def kernel(kh: int, kw: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((kh, kw)).astype(np.float32)


def same(name: str, dask_fn, whole_fn, img: np.ndarray, chunks, **opts) -> None:
    """dask_fn on img in `chunks` equals whole_fn on img (values, dtype, shape), and
    the result keeps the input's chunks."""
    x = da.from_array(img, chunks=chunks)
    y = dask_fn(x, **opts)
    expected = whole_fn(img, **opts)
    assert isinstance(y, da.Array)
    assert y.dtype == expected.dtype and y.shape == expected.shape, name
    assert y.chunks == x.chunks[: y.ndim], name
    got = y.compute()
    assert np.array_equal(got, expected, equal_nan=True), (
        f"{name}: {np.count_nonzero(got != expected)} pixels differ"
    )


@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", (1, 3))
def test_every_border_matches_whole_image(border, dtype, channels):
    """23x31 in 7x11 chunks (4 x 3, the last of each a remainder; the middle ones
    meet a chunk on every side): filter2d with off-centre anchors, blur (odd, even,
    rectangular), contour; constant borders with a non-zero value."""
    shape = (23, 31) if channels == 1 else (23, 31, channels)
    img = image(shape, dtype, seed=BORDERS.index(border) * 10 + channels)
    chunks = (7, 11) if channels == 1 else (7, 11, 1)
    opts = dict(border=border, border_value=7.25, backend="cpu")
    k = kernel(5, 7, seed=1)
    for anchor in (None, (0, 0), (6, 4), (1, 3)):
        same(f"filter2d {anchor}", ifd.filter2d, imgfilter.filter2d, img, chunks, kernel=k,
             anchor=anchor, **opts)  # fmt: skip
    for k_box, anchor in ((5, None), (4, None), ((3, 8), (2, 0))):
        same(f"blur {k_box}", ifd.blur, imgfilter.blur, img, chunks, k=k_box, anchor=anchor,
             **opts)  # fmt: skip
    if dtype != np.float32:
        same("contour", ifd.contour, imgfilter.contour, img, chunks, **opts)


@pytest.mark.parametrize("border", BORDERS)
def test_kernels_larger_than_a_chunk(border):
    """31x31 kernels on 7-pixel chunks: random (direct path), Gaussian (rank 1,
    separable path), a box; and a 9x5 kernel anchored in a corner."""
    opts = dict(border=border, border_value=3, backend="cpu")
    g = np.exp(-0.5 * ((np.arange(31) - 15) / 5.0) ** 2)
    gauss = np.outer(g, g).astype(np.float32)
    gauss /= gauss.sum()
    for dtype, seed in ((np.uint8, 2), (np.float32, 3)):
        img = image((37, 53, 3), dtype, seed)
        for name, k in (("random", kernel(31, 31, seed)), ("gauss", gauss)):
            same(f"{name} {dtype.__name__}", ifd.filter2d, imgfilter.filter2d, img, (7, 7, 3),
                 kernel=k, **opts)  # fmt: skip
        same("blur 31", ifd.blur, imgfilter.blur, img, (7, 7, 3), k=31, **opts)
        same("corner anchor", ifd.filter2d, imgfilter.filter2d, img, (7, 7, 3),
             kernel=kernel(9, 5, seed), anchor=(4, 8), **opts)  # fmt: skip


@pytest.mark.parametrize("border", BORDERS)
def test_irregular_chunks_and_tiny_images(border):
    """Irregular row chunks, a chunked channel axis, kernels larger than the image."""
    opts = dict(border=border, border_value=200, backend="cpu")
    img = image((37, 53, 3), np.uint16, seed=4)
    for chunks in (((5, 20, 12), (53,), (3,)), ((1, 30, 6), (10, 40, 3), (1, 2))):
        same(f"filter2d {chunks}", ifd.filter2d, imgfilter.filter2d, img, chunks,
             kernel=kernel(7, 3, 5), anchor=(2, 6), **opts)  # fmt: skip
        same(f"contour {chunks}", ifd.contour, imgfilter.contour, img, chunks, **opts)
    tiny = image((5, 4), np.uint8, seed=6)
    for chunks in ((2, 3), (1, 1), (5, 4)):
        same(f"tiny filter2d {chunks}", ifd.filter2d, imgfilter.filter2d, tiny, chunks,
             kernel=kernel(31, 9, 7), **opts)  # fmt: skip
        same(f"tiny blur {chunks}", ifd.blur, imgfilter.blur, tiny, chunks, k=(3, 17), **opts)


@pytest.mark.parametrize("border", ("reflect101", "wrap", "constant"))
def test_bands_are_filtered_as_they_are_and_only_their_ends_with_neighbour_rows(
    monkeypatch, border
):
    """A band is filtered as it is, and its `depth` rows next to each neighbour from a
    strip of 3 * depth rows (the neighbour's and its own): no band is copied to join
    it with its neighbours, except one shorter than 2 * depth, joined whole. Host
    pieces past api.BANDS_MIN_BYTES (here all) are joined by streamed.join_rows.
    Results unchanged; a band without neighbours (one chunk) is filtered as it is."""
    from imgfilter import streamed

    joined, filtered = [], []
    real_join, real_filter = streamed.join_rows, ifd._api_filter2d

    def join(parts):
        joined.append([len(p) for p in parts])
        return real_join(parts)

    def filter2d(band, *args, **opts):
        filtered.append(len(band))
        return real_filter(band, *args, **opts)

    monkeypatch.setattr(streamed, "join_rows", join)
    monkeypatch.setattr(ifd, "_api_filter2d", filter2d)
    monkeypatch.setattr(imgfilter.api, "BANDS_MIN_BYTES", 1)
    img = image((41, 29, 3), np.uint8, seed=12)
    opts = dict(border=border, border_value=5, backend="cpu")
    # 7 kernel rows, anchor row 5: 5 rows above, 1 below, depth 5; bands 12, 12, 12, 5
    # (wrap: the rows it reaches, 5 and 1, added to the first and last: 17, 12, 12, 6)
    same("filter2d", ifd.filter2d, imgfilter.filter2d, img, (12, 29, 3), kernel=kernel(7, 5, 13),
         anchor=(1, 5), **opts)  # fmt: skip
    # Three bands as they are, five end strips, the last band joined with 5 rows above.
    first, last = (17, 6) if border == "wrap" else (12, 5)
    assert sorted(filtered) == sorted([first, 12, 12, 5 + last] + [15] * 5)
    assert sorted(joined) == [[5, last]] + [[5, 10]] * 2 + [[10, 5]] * 3
    joined.clear()
    same("one band", ifd.blur, imgfilter.blur, img, (41, 29, 3), k=5, **opts)
    assert joined == []


def test_errors_are_the_apis_and_raised_at_build_time():
    """Each bad option raises the API's UsageError (same message) before any compute:
    the source array below fails if anything computes it."""

    def boom(block):
        raise AssertionError("computed")

    img = image((20, 30, 3), np.uint8, seed=8)
    x = da.from_array(img, chunks=(5, 30, 3)).map_blocks(boom, dtype=np.uint8)
    cases = [
        ("blur", (0,), {}),
        ("blur", (5000,), {}),
        ("blur", (3,), {"border": "mirror"}),
        ("blur", (3,), {"anchor": (3, 0)}),
        ("blur", (3,), {"method": "fast"}),
        ("filter2d", ([[1, 2], [3]],), {}),
        ("filter2d", (np.ones((300, 3)),), {}),
        ("filter2d", ([[np.nan]],), {}),
        ("contour", (), {"border": "nope"}),
    ]
    for name, args, kw in cases:
        with pytest.raises(UsageError) as theirs:
            getattr(imgfilter, name)(img, *args, **kw)
        with pytest.raises(UsageError) as ours:
            getattr(ifd, name)(x, *args, **kw)
        assert str(ours.value) == str(theirs.value), (name, args, kw)
    for bad in (
        np.zeros((4, 4, 2), np.uint8),
        np.zeros((4, 4), np.int32),
        np.zeros((2, 4, 4, 3), np.uint8),
        np.zeros((0, 4), np.uint8),
    ):
        with pytest.raises(UsageError) as theirs:
            imgfilter.blur(bad, 3)
        with pytest.raises(UsageError) as ours:
            ifd.blur(da.from_array(bad), 3)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(UsageError, match="float32"):
        ifd.contour(da.zeros((8, 8), np.float32))
    with pytest.raises(UsageError, match="unknown backend"):
        ifd.blur(x, 3, backend="tpu")
    with pytest.raises(UsageError, match="dask array"):
        ifd.blur(img, 3)


def test_graph_is_lazy_and_keeps_shape_dtype_chunks():
    img = image((40, 24, 3), np.float32, seed=9)
    x = da.from_array(img, chunks=(9, 8, 3))
    y = ifd.blur(x, 7, backend="cpu")
    assert (y.shape, y.dtype, y.chunks) == (x.shape, x.dtype, x.chunks)
    c = ifd.contour(x.astype(np.uint8), backend="cpu")
    assert (c.shape, c.dtype, c.chunks) == (x.shape[:2], np.uint8, x.chunks[:2])


def test_a_bands_filter_waits_for_no_neighbour_and_only_halo_rows_leave_one():
    """Per band: a task filtering it alone (its only input the band), one slicing its
    depth rows at each end (run where the band lies, the only rows that travel) and one
    redoing its rows next to the neighbours with theirs: 3n tasks for n full-width
    bands, none of them fused away by Dask's optimizer."""
    img = image((60, 16, 3), np.uint8, seed=10)
    x = da.from_array(img, chunks=(12, -1, -1)).persist()  # 5 bands, already computed
    y = ifd.blur(x, 9, backend="cpu")  # depth 4
    graph = dict(y.__dask_graph__())
    new = {key: task for key, task in graph.items() if key not in dict(x.__dask_graph__())}
    assert len(new) == 3 * 5
    optimized = dict(y.__dask_optimize__(y.__dask_graph__(), y.__dask_keys__()))
    assert len(optimized) == len(new) + 5  # and the 5 source bands
    for kind in ("ends", "alone"):  # each of its own band, nothing else
        keys = [key for key in new if kind in key[0]]
        assert len(keys) == 5
        for key in keys:
            assert set(dask.core.get_dependencies(graph, key)) == {(x.name, key[1], 0, 0)}
    ends = [dask.get(graph, key) for key in new if "ends" in key[0]]
    assert {part.shape[0] for pair in ends for part in pair} == {4}
    assert np.array_equal(y.compute(), imgfilter.blur(img, 9, backend="cpu"))


def test_core_package_does_not_import_dask():
    code = "import sys, imgfilter, imgfilter.api, imgfilter.border; print('dask' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_missing_dask_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask", None)
    monkeypatch.setitem(sys.modules, "dask.array", None)
    monkeypatch.delitem(sys.modules, "imgfilter.dask")
    with pytest.raises(ImportError, match=r'pip install "imgfilter\[dask\]"'):
        importlib.import_module("imgfilter.dask")


@pytest.mark.parametrize("border", ("reflect101", "wrap"))
def test_cuda_backend(border):
    """The CUDA backend on host chunks (Numba's simulator without a GPU): small (2 x 2
    chunks: the chunk logic itself is test_every_border_matches_whole_image's), on
    dask's synchronous scheduler (the simulator is no place for concurrency)."""
    img = image((13, 17, 3), np.uint8, seed=10)
    k = np.random.default_rng(11).integers(-3, 4, (3, 3)).astype(np.float32)
    opts = dict(border=border, border_value=9, backend="cuda")
    with dask.config.set(scheduler="synchronous"):
        same("blur", ifd.blur, imgfilter.blur, img, (7, 9, 3), k=3, **opts)
        same("filter2d", ifd.filter2d, imgfilter.filter2d, img, (7, 9, 3), kernel=k, **opts)
        same("contour", ifd.contour, imgfilter.contour, img, (7, 9, 3), **opts)


@pytest.mark.gpu
@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_chunks(border, dtype):
    """CuPy chunks stay CuPy, and equal imgfilter on the whole image on the device:
    filter2d (random 5x7, off-centre anchor; 21x21), blur 21, contour."""
    cp = pytest.importorskip("cupy")
    img = image((301, 413, 3), dtype, seed=12)
    whole = cp.asarray(img)
    x = da.from_array(img, chunks=(37, 100, 3)).map_blocks(cp.asarray, dtype=img.dtype)
    opts = dict(border=border, border_value=5)
    calls = [
        ("filter2d", dict(kernel=kernel(5, 7, 13), anchor=(1, 4))),
        ("filter2d", dict(kernel=kernel(21, 21, 14))),
        ("blur", dict(k=21)),
    ]
    if dtype != np.float32:
        calls.append(("contour", {}))
    for name, kw in calls:
        y = getattr(ifd, name)(x, **kw, **opts)
        assert isinstance(y._meta, cp.ndarray), name
        got = y.compute()
        assert isinstance(got, cp.ndarray), name
        expected = cp.asarray(getattr(imgfilter, name)(whole, **kw, **opts))
        assert bool(cp.array_equal(got, expected)), f"{name} {kw.keys()}"


@pytest.mark.gpu
def test_cupy_band_tasks_run_after_the_work_that_made_their_band():
    """A band made by work still queued on the thread's current CuPy stream (a
    non-blocking one, busy with a large computation first) is filtered after that
    work: the band's filter is queued on the stream its array names."""
    cp = pytest.importorskip("cupy")
    img = image((600, 500, 3), np.uint8, seed=15)
    user = cp.cuda.Stream(non_blocking=True)
    with user:
        busy = cp.arange(1 << 26, dtype=cp.float32)
        for _ in range(20):  # keeps the stream busy while the bands are queued
            busy = cp.sqrt(busy * busy + 1)
        x = da.from_array(img, chunks=(75, -1, -1)).map_blocks(
            lambda b: cp.asarray(b) + (busy[:1] * 0).astype(cp.uint8), dtype=np.uint8
        )
        got = ifd.blur(x, 9).compute(scheduler="sync")
    expected = cp.asarray(imgfilter.blur(cp.asarray(img), 9))
    assert bool(cp.array_equal(got, expected))


@pytest.mark.gpu
def test_cupy_bands_on_two_workers():
    """CuPy bands on two worker processes, so the rows next to the seam between them
    travel from one worker's GPU to the other's: the result equals imgfilter on the
    whole image (filter2d, bands with their seams redone; blur with a kernel taller
    than two bands' halos, bands joined whole with their neighbours' rows)."""
    cp = pytest.importorskip("cupy")
    distributed = pytest.importorskip("dask.distributed")
    img = image((301, 413, 3), np.uint8, seed=18)
    whole = cp.asarray(img)
    k = kernel(9, 5, 19)
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster,
        distributed.Client(cluster) as client,
    ):
        x = da.from_array(img, chunks=(40, -1, -1)).map_blocks(cp.asarray, dtype=img.dtype)
        first, second = sorted(client.scheduler_info()["workers"])
        halves = [client.persist(x.blocks[:4], workers=[first]),
                  client.persist(x.blocks[4:], workers=[second])]  # fmt: skip
        x = da.concatenate(halves).persist()  # bands 0-3 on one worker, 4-7 on the other
        distributed.wait(x)
        assert len({w for ws in client.who_has(x).values() for w in ws}) == 2
        for border in ("reflect101", "wrap"):
            y = ifd.filter2d(x, k, border=border).compute()
            expected = imgfilter.filter2d(whole, k, border=border)
            assert bool(cp.array_equal(cp.asarray(y), cp.asarray(expected))), border
            y = ifd.blur(x, (3, 45), border=border).compute()  # depth 22: joined whole
            expected = imgfilter.blur(whole, (3, 45), border=border)
            assert bool(cp.array_equal(cp.asarray(y), cp.asarray(expected))), border
