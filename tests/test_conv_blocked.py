"""The register-blocked kernel's own pieces: float32 saturation, 64-bit offsets, the
accumulating variant, its launch's checks and its low-rank passes (`kernels.conv.launch`)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from imgfilter.backends import opencv as ref
from kernels.common.saturate import saturate_f32, saturate_int
from kernels.conv import blocked as conv_blocked
from kernels.conv import launch as conv_launch
from kernels.conv import plan as conv_plan


def test_saturate_f32_equals_saturate_int():
    rng = np.random.default_rng(0)
    halves = np.arange(-4, 260) + np.float32(0.5)  # ties: round half to even
    near = np.nextafter(halves.astype(np.float32), np.float32(np.inf))
    values = np.concatenate(
        [
            halves.astype(np.float32),
            near,
            np.nextafter(halves.astype(np.float32), np.float32(-np.inf)),
            (rng.standard_normal(2000) * 40000).astype(np.float32),
            np.float32([0.0, -0.0, 65534.5, 65535.5, 65535.49, 1e9, -1e9, 3e38, -3e38]),
        ]
    )
    for lo, hi in ((0, 255), (0, 65535)):
        for v in values:
            assert saturate_f32(v, lo, hi) == saturate_int(float(v), lo, hi), (v, lo, hi)
        # infinities (Python's round raises; the GPU's conversion saturates)
        assert saturate_f32(np.float32(np.inf), lo, hi) == hi
        assert saturate_f32(np.float32(-np.inf), lo, hi) == lo
    # NaN: saturate_int on the GPU clamps the conversion's 0; here lo, the same.
    assert saturate_f32(np.float32(np.nan), 0, 255) == 0


def test_offsets_fit():
    assert conv_plan.offsets_fit((2167, 2495, 3))
    assert not conv_plan.offsets_fit((65536, 65536, 1))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_wide_offsets_variant_matches(dtype):
    # The uint64-offset variant (images of 2**32 elements or more) on a small image.
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (21, 40, 3)).astype(dtype)
    kernel = rng.standard_normal((3, 5)).astype(np.float32)
    d_img = cuda.to_device(img)
    d_out = cuda.device_array_like(d_img)
    flat = cuda.to_device(kernel.reshape(-1))
    args = conv_plan.scalar_args(img.dtype, (1, 2), 0, 0.0)
    kernel_fn = conv_launch.blocked_kernel(3, 5, wide=True).dispatcher
    kernel_fn[conv_plan.grid(img.shape, 3), (conv_plan.TX, conv_plan.TY, 1)](
        d_img, flat, *args, d_out
    )
    want = ref.filter2d(img, kernel)
    got = d_out.copy_to_host()
    if dtype == np.uint8:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_accumulate_variant_adds_the_sum_before_rounding(wide, dtype):
    """out = acc + correlation, rounded once; acc given as a separate array and as
    out itself (float32 out), 70 columns of 3 channels: three tile columns."""
    rng = np.random.default_rng(2)
    img = rng.integers(0, 256, (19, 70, 3)).astype(dtype)
    kernel = (rng.standard_normal((5, 3)) / 4).astype(np.float32)
    acc = (rng.standard_normal(img.shape) * 40 + 60).astype(np.float32)
    want_f = ref.filter2d(img.astype(np.float32), kernel) + acc  # centred, reflect101
    flat = cuda.to_device(kernel.reshape(-1))
    launch = conv_launch.blocked_kernel(5, 3, wide=wide, accumulate=True).dispatcher
    grid, block = conv_plan.grid(img.shape, 5), (conv_plan.TX, conv_plan.TY, 1)
    d_img, d_acc = cuda.to_device(img), cuda.to_device(acc)

    d_out = cuda.device_array_like(d_img)
    args = conv_plan.scalar_args(img.dtype, (2, 1), 0, 0.0)  # mode 0: reflect101
    launch[grid, block](d_img, flat, *args, d_out, d_acc)
    hi = np.iinfo(dtype).max
    got = d_out.copy_to_host().astype(np.float64)
    assert np.abs(got - np.clip(np.round(want_f), 0, hi)).max() <= 1

    args = conv_plan.scalar_args(np.float32, (2, 1), 0, 0.0)
    launch[grid, block](d_img, flat, *args, d_acc, d_acc)  # in place: acc is out
    np.testing.assert_allclose(d_acc.copy_to_host(), want_f, rtol=1e-5, atol=1e-3)


def test_accumulate_refuses_a_sum_of_another_shape_or_dtype():
    img = cuda.to_device(np.ones((8, 10, 3), np.uint8))
    weights = cuda.to_device(np.ones((3, 3), np.float32))
    out = cuda.device_array((8, 10, 3), np.uint8)
    for acc in (cuda.device_array((8, 10, 1), np.float32), cuda.device_array((8, 10, 3))):
        with pytest.raises(ValueError, match="acc must be float32"):
            conv_launch.correlate_blocked(img, weights, (1, 1), 0, 0.0, out, acc)


def test_non_contiguous_arrays_are_refused():
    img = cuda.to_device(np.zeros((8, 10, 3), np.uint8))
    view = img[:, ::2]
    weights = cuda.to_device(np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        conv_launch.correlate_blocked(view, weights, (1, 1), 0, 0.0, cuda.device_array((8, 5, 3)))


def test_one_kernel_per_shape_and_variant_however_named():
    """A NumPy int, a default and a spelled-out False name one ref, whose dispatcher is
    the factory's one kernel for those arguments; other variants are other kernels."""
    ref = conv_launch.blocked_kernel(np.int64(3), 5)
    assert ref is conv_launch.blocked_kernel(3, 5, False, False)
    assert ref.args == (3, 5, False, False) and type(ref.args[0]) is int
    assert ref.dispatcher is conv_blocked.kernel_for(3, 5, False, False)
    others = {conv_launch.blocked_kernel(3, 5, True), conv_launch.blocked_kernel(3, 5, False, True)}
    assert ref not in others and len(others) == 2
    assert conv_launch.blocked_kernel(3, 5, True).dispatcher is not ref.dispatcher


def _low_rank(img, kernel_terms, anchor, border, cval):
    """correlate_low_rank of `img` with the sum of the outer products `kernel_terms`."""
    terms = []
    for col, row in kernel_terms:
        d_row = cuda.to_device(np.float32(row).reshape(1, -1))
        d_col = cuda.to_device(np.float32(col).reshape(-1, 1))
        terms.append((d_row, d_col, float(np.float32(row).sum())))
    d_out = cuda.device_array(img.shape, img.dtype)
    conv_launch.correlate_low_rank(cuda.to_device(img), terms, anchor, border, cval, d_out)
    return d_out.copy_to_host()


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_low_rank_passes_equal_the_whole_kernel(rank):
    """Integer factors (exact in float32): rank 1 takes the two separable passes, more
    a running float32 sum; either way every border gives the 2-D correlation's bits,
    a constant border's value included (row passes see cval * sum of the row)."""
    from imgfilter.border import BORDERS

    rng = np.random.default_rng(20 + rank)
    img = rng.integers(0, 256, (11, 37, 2)).astype(np.uint8)
    pairs = [(rng.integers(-2, 3, 5), rng.integers(-2, 3, 4)) for _ in range(rank)]
    whole = sum(np.outer(c, r) for c, r in pairs).astype(np.float32)
    for border in ("reflect101", "constant", "wrap"):
        got = _low_rank(img, pairs, (2, 1), BORDERS[border], 9)
        want = ref.filter2d(img, whole, (1, 2), border, 9)
        np.testing.assert_array_equal(got, want, border)
