"""Host images filtered in row bands through a small GPU budget (issue 27, section 2):
bit-identical to the whole image for every border mode, off-centre anchors, kernels
taller than a band, and every filter. The simulator runs the bands in CI (plain
copies); on a GPU every test runs through pinned buffers and two streams, and the
`gpu` test on a larger image with many bands."""

from __future__ import annotations

import numpy as np
import pytest

import imgfilter
from imgfilter import api, streamed

BORDERS = ("constant", "replicate", "reflect", "reflect101", "wrap")


def _image(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 1e3).astype(dtype)
    return rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)


def test_band_plan_covers_every_row_once_with_its_halo():
    for height, reach, rows in (
        (53, (3, 5), 7),
        (10, (0, 0), 3),
        (9, (4, 4), 20),
        (31, (30, 0), 31),
    ):
        plan = streamed.band_plan(height, reach, rows, wrap=False)
        assert [y for y0, y1, _ in plan for y in range(y0, y1)] == list(range(height))
        for y0, y1, source in plan:
            lo, hi = y0 - reach[0], y1 + reach[1]
            assert source.start <= max(0, lo) and source.stop >= min(height, hi)
            if lo > 0 and hi < height:  # inside the image: the halo alone
                assert (source.start, source.stop) == (lo, hi)
    plan = streamed.band_plan(20, (2, 3), 8, wrap=True)
    assert list(plan[0][2]) == [18, 19, *range(11)]
    assert plan[1][2] == slice(6, 19)
    assert list(plan[2][2]) == [14, 15, *range(16, 20), 0, 1, 2]


def test_band_rows_fit_the_budget_and_reach_past_the_halo():
    assert streamed.band_rows(1000, 300, 300, (5, 5), budget=10**9) == 1000
    rows = streamed.band_rows(1000, 300, 300, (5, 5), budget=200_000)
    assert 6 <= rows < 1000
    assert 2 * ((rows + 10) * 300 * 3 + rows * 300) <= 200_000
    assert streamed.band_rows(1000, 300, 300, (40, 2), budget=1) == 41


def _blur(k, anchor, border, method="auto"):
    def apply(src, dst, stream):
        imgfilter.blur(src, k, border=border, border_value=9, anchor=anchor, method=method,
                       out=dst, stream=stream)  # fmt: skip

    return apply


# Box sizes (w, h) and anchors on a 31-row image: off-centre; taller than a band (its
# reach makes bands of 26 rows, for budget 1 and 3,400 alike); even sizes.
BOXES = (((3, 9), (1, 2)), ((1, 31), (0, 25)), ((4, 6), None))


@pytest.mark.parametrize(
    "border, budget, method",
    [("reflect101", 1, "packed"), ("reflect", 1, "fused"), ("replicate", 1, "twopass"),
     ("constant", 1, "running"), ("wrap", 1, "separable"),
     ("wrap", 3_400, "auto"), ("reflect101", 3_400, "auto")],
)  # fmt: skip
def test_blur_in_bands_equals_the_whole_image(border, budget, method):
    """Budget 1: bands of the fewest rows (the box's reach plus one), every border,
    each box kernel but box_tiled through the bands (on the simulator a box_tiled
    launch costs 2-10 times the others'). Budget 3,400: bands of 10-12 rows, box_auto
    (box_tiled here). One channel: the bands are full rows whatever the channels, and
    the simulator's launches cost about a third of three channels' (16 s -> 5 s); each
    kernel's channel counts are its own test file's."""
    img = _image((31, 17, 1), np.uint8, seed=budget)
    boxes = BOXES if budget == 1 else BOXES[::2]  # the tall box: the bands of budget 1
    for k, anchor in boxes:
        kh = k[1]
        ay = kh // 2 if anchor is None else anchor[1]
        want = imgfilter.blur(img, k, border=border, border_value=9, anchor=anchor,
                              method=method, backend="cuda")  # fmt: skip
        out = np.empty_like(img)
        streamed.filter_in_bands(img, out, (ay, kh - 1 - ay), border == "wrap",
                                 _blur(k, anchor, border, method), budget)  # fmt: skip
        np.testing.assert_array_equal(out, want, err_msg=f"{k} {anchor}")


@pytest.mark.parametrize("border", BORDERS)
def test_filter2d_and_contour_in_bands_equal_the_whole_image(border):
    kernel = np.random.default_rng(1).standard_normal((9, 5)).astype(np.float32)
    # Bands of 5 rows (the fewest) and of 10 (uint16: a launch costs it four times
    # float32's on the simulator).
    for dtype, channels, budget in ((np.float32, 1, 1000), (np.uint16, 4, 20_000)):
        img = _image((29, 13, channels), dtype, seed=channels)
        want = imgfilter.filter2d(img, kernel, border=border, border_value=3, backend="cuda")
        out = np.empty_like(img)

        def apply(src, dst, stream):
            imgfilter.filter2d(src, kernel, border=border, border_value=3, out=dst, stream=stream)

        streamed.filter_in_bands(img, out, (4, 4), border == "wrap", apply, budget)
        np.testing.assert_array_equal(out, want)
        if dtype != np.float32:
            want = imgfilter.contour(img, border=border, backend="cuda")
            out = np.empty(img.shape[:2], dtype)

            def apply(src, dst, stream):
                imgfilter.contour(src, border=border, out=dst, stream=stream)

            streamed.filter_in_bands(img, out, (1, 1), border == "wrap", apply, budget=500)
            np.testing.assert_array_equal(out, want)


def test_one_row_and_one_column_images():
    for shape in ((1, 40, 3), (40, 1, 1)):
        img = _image(shape, np.uint8)
        want = imgfilter.blur(img, 5, border="reflect", backend="cuda")
        out = np.empty_like(img)
        # Bands of 10 rows (the one-column image: 4 of them).
        streamed.filter_in_bands(img, out, (2, 2), False, _blur(5, None, "reflect"), budget=160)
        np.testing.assert_array_equal(out, want)


# The API's way into the bands the two tests above check: --sample (CI's lowest
# versions) leaves it to them.
@pytest.mark.covered_elsewhere
@pytest.mark.parametrize("border", ["reflect", "wrap"])
def test_api_max_gpu_bytes_streams_with_the_same_result(monkeypatch, border):
    """max_gpu_bytes below a call's need (12 gray rows: 528 bytes each call) sends it
    in bands: 3 to 6 of them here."""
    img = _image((12, 11), np.uint8, seed=7)
    kernel = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    calls = [
        lambda **kw: imgfilter.blur(img, (3, 7), border=border, border_value=5, **kw),
        lambda **kw: imgfilter.filter2d(img, kernel, border=border, border_value=5, **kw),
        lambda **kw: imgfilter.contour(img, border=border, **kw),
    ]
    plans, real_plan = [], streamed.band_plan
    monkeypatch.setattr(streamed, "band_plan", lambda *a: plans.append(real_plan(*a)) or plans[-1])
    for call in calls:
        want = call(backend="cuda")
        got = call(backend="cuda", max_gpu_bytes=400)
        np.testing.assert_array_equal(got, want)
        for budget in (400, None):  # in bands, and whole
            out = np.zeros_like(want)
            assert call(backend="cuda", max_gpu_bytes=budget, out=out) is out
            np.testing.assert_array_equal(out, want)
    assert [len(plan) >= 3 for plan in plans] == [True] * 6, plans


def test_large_host_images_go_in_bands_by_default(monkeypatch):
    """On the CUDA backend a host image of BANDS_MIN_BYTES or more goes in bands
    (budget: 80% of the free device memory) even where it fits; a smaller one, or one
    whose max_gpu_bytes covers its need, goes whole; the CPU backend never bands."""
    import types

    import kernels.common.arrays
    import kernels.common.cudadrv
    from imgfilter import api

    class Driver:
        def free_and_total(self):
            return 10_000_000_000, 80_000_000_000

    monkeypatch.setattr(kernels.common.arrays, "SIMULATOR", False)
    monkeypatch.setattr(kernels.common.cudadrv, "driver", Driver)
    cuda, cpu = types.SimpleNamespace(NAME="cuda"), types.SimpleNamespace(NAME="cpu")
    big = np.empty(api.BANDS_MIN_BYTES, np.uint8)
    small = np.empty(api.BANDS_MIN_BYTES - 1, np.uint8)
    assert api._band_budget(cuda, big, big.nbytes, None) == 8_000_000_000
    assert api._band_budget(cuda, small, small.nbytes, None) == 0
    assert api._band_budget(cpu, big, big.nbytes, None) == 0
    need = big.nbytes * (1 + streamed.SCRATCH_PER_BYTE) + big.nbytes
    assert api._band_budget(cuda, big, big.nbytes, need) == 0
    assert api._band_budget(cuda, small, small.nbytes, need // 8) == need // 8


def test_api_max_gpu_bytes_is_checked():
    img = _image((8, 8, 1), np.uint8)
    for bad in (0, -5, True):
        with pytest.raises(imgfilter.UsageError, match="max_gpu_bytes"):
            imgfilter.blur(img, 3, backend="cuda", max_gpu_bytes=bad)
    # The CPU backend has no GPU memory to spare: the option changes nothing there.
    np.testing.assert_array_equal(
        imgfilter.blur(img, 3, backend="cpu", max_gpu_bytes=10),
        imgfilter.blur(img, 3, backend="cpu"),
    )


def test_command_line_max_gpu_memory(tmp_path):
    import cv2
    from test_cli import assert_ok, assert_one_line_error, imread, run

    img = _image((33, 21, 3), np.uint8, seed=3)
    cv2.imwrite(str(tmp_path / "in.png"), img)
    out = tmp_path / "out.png"
    done = run("blur", tmp_path / "in.png", "--k", "5", "--backend", "cuda",
               "--max-gpu-memory", "8K", "-o", out)  # fmt: skip
    assert_ok(done)
    np.testing.assert_array_equal(imread(out), imgfilter.blur(img, 5, backend="cuda"))
    bad = run("blur", tmp_path / "in.png", "--k", "5", "--max-gpu-memory", "lots", "-o", out)
    assert_one_line_error(bad, 2, "--max-gpu-memory")


@pytest.mark.gpu
@pytest.mark.parametrize("border", ["reflect101", "wrap", "constant"])
def test_gpu_bands_through_pinned_buffers_and_two_streams(border):
    img = _image((3001, 1237, 3), np.uint8, seed=11)
    kernel = np.random.default_rng(5).standard_normal((21, 17)).astype(np.float32) / 20
    for call in (
        lambda **kw: imgfilter.blur(img, (9, 31), border=border, border_value=4, **kw),
        lambda **kw: imgfilter.filter2d(img, kernel, border=border, border_value=4, **kw),
        lambda **kw: imgfilter.contour(img, border=border, **kw),
    ):
        want = call(backend="cuda")
        np.testing.assert_array_equal(call(backend="cuda", max_gpu_bytes=3 << 20), want)


@pytest.mark.gpu
def test_gpu_banded_calls_from_several_threads_at_once():
    """Threads filtering large host images at once (a many-files pipeline of big frames,
    a Dask worker with threads) share the band streams: each result is still the one a
    call alone gives, for forced small budgets and for the default bands (32 MiB up)."""
    from concurrent.futures import ThreadPoolExecutor

    small = [_image((3001, 1237, 3), np.uint8, seed=s) for s in range(4)]
    large = [_image((4096, 3072, 3), np.uint8, seed=10 + s) for s in range(2)]
    assert large[0].nbytes >= api.BANDS_MIN_BYTES
    kernel = np.random.default_rng(5).standard_normal((21, 17)).astype(np.float32) / 20

    def calls(img, budget):
        return (
            lambda: imgfilter.blur(img, 21, border="wrap", max_gpu_bytes=budget),
            lambda: imgfilter.filter2d(img, kernel, border="reflect101", max_gpu_bytes=budget),
            lambda: imgfilter.contour(img, border="constant", max_gpu_bytes=budget),
        )

    jobs = [c for img in small for c in calls(img, 3 << 20)]
    jobs += [c for img in large for c in calls(img, None)]
    want = [imgfilter.blur(img, 21, border="wrap", max_gpu_bytes=1 << 62) for img in small[:1]]
    alone = [job() for job in jobs]
    np.testing.assert_array_equal(alone[0], want[0])  # bands alone == one piece
    with ThreadPoolExecutor(6) as pool:
        for _ in range(2):
            together = list(pool.map(lambda job: job(), jobs))
            for a, b in zip(alone, together, strict=True):
                np.testing.assert_array_equal(a, b)


def test_join_rows_equals_concatenate():
    """Parts large enough to be copied in several threads (4 MiB pieces), and small."""
    rng = np.random.default_rng(21)
    parts = [rng.integers(0, 255, (n, 1024, 3), dtype=np.uint8) for n in (3, 3000, 1, 2500)]
    got = streamed.join_rows(parts)
    np.testing.assert_array_equal(got, np.concatenate(parts))
    assert got.flags.c_contiguous and got.dtype == np.uint8
