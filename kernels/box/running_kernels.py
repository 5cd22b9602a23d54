"""The kernels of `kernels.box.running` (Numba CUDA): the separable passes and the
running-sum passes. Importing this module imports Numba: `kernels.box.running` names
these kernels by `kernels.common.refs.KernelRef` and imports it only where one does not ship.
"""

from __future__ import annotations

from numba import cuda, float32, float64, uint64

from ..common.device import border_index, saturate_int
from ..common.refs import kernel_factory
from .plan import RUNNING_RUN

# ----------------------------------------------------------------- separable passes


@cuda.jit(cache=True)
def box_rows(img, kw, ax, mode, cval, sums):
    """sums[y, x, c] = sum of img[y, x - ax : x - ax + kw, c] with borders applied."""
    x, y = cuda.grid(2)
    c = cuda.blockIdx.z
    height, width = img.shape[0], img.shape[1]
    if y >= height or x >= width:
        return
    acc = 0.0  # float64 in registers: exact for any integer image
    for j in range(kw):
        xx = border_index(x + j - ax, width, mode)
        if xx < 0:
            acc += cval
        else:
            acc += img[y, xx, c]
    sums[y, x, c] = acc


@cuda.jit(cache=True)
def box_cols(sums, kh, ay, mode, row_cval, area, lo, hi, is_int, out):
    """out = (sum of kh row sums around y) / area, rounded and saturated as filter2D."""
    x, y = cuda.grid(2)
    c = cuda.blockIdx.z
    height, width = sums.shape[0], sums.shape[1]
    if y >= height or x >= width:
        return
    acc = 0.0
    for i in range(kh):
        yy = border_index(y + i - ay, height, mode)
        if yy < 0:
            acc += row_cval
        else:
            acc += sums[yy, x, c]
    v = acc / area  # a correctly rounded division keeps exact halves exact
    if is_int:
        out[y, x, c] = saturate_int(v, lo, hi)
    else:
        out[y, x, c] = v


# ------------------------------------------------------------ running sums, two passes


@cuda.jit(device=True)
def _at(img, y, ux, uc, cval):
    """img[y, x, c] for a mapped row y, or the constant border value when y < 0."""
    if y < 0:
        return cval
    return cval - cval + img[uint64(y), ux, uc]


@cuda.jit(cache=True)
def box_column_sums(img, kh, ay, mode, cval, strip, sums):
    """sums[y, x * C + c] = sum of img[y - ay : y - ay + kh, x, c], borders applied.

    One thread per (column, channel) lane walks `strip` rows keeping a running sum:
    after the first row, each row adds the entering input row and subtracts the
    leaving one. Consecutive threads read consecutive bytes. Rows go four at a
    time with all eight loads issued before any is used, so a thread waits for
    memory once per four rows. cval's type sets the accumulator: int64 for integer
    images (exact, no slow int<->float conversions), float64 for float32 images;
    sums' dtype is chosen by the host to hold the sums (uint16 for uint8 input).
    """
    lane = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    height, width, channels = img.shape
    if lane >= width * channels:
        return
    x = lane // channels
    # Unsigned indices where they are known non-negative: Numba wraps negative
    # signed indices at a cost of several instructions per access.
    ux = uint64(x)
    uc = uint64(lane - x * channels)
    ulane = uint64(lane)
    y_begin = cuda.blockIdx.y * strip
    y_end = min(y_begin + strip, height)
    acc = cval - cval
    for i in range(kh):
        acc += _at(img, border_index(y_begin + i - ay, height, mode), ux, uc, cval)
    sums[uint64(y_begin), ulane] = acc
    enter = kh - ay - 1  # row entering at output row y is y + enter
    leave = -ay - 1  # row leaving at output row y is y + leave
    y = y_begin + 1
    while y + 3 < y_end:
        in0 = _at(img, border_index(y + enter, height, mode), ux, uc, cval)
        in1 = _at(img, border_index(y + 1 + enter, height, mode), ux, uc, cval)
        in2 = _at(img, border_index(y + 2 + enter, height, mode), ux, uc, cval)
        in3 = _at(img, border_index(y + 3 + enter, height, mode), ux, uc, cval)
        out0 = _at(img, border_index(y + leave, height, mode), ux, uc, cval)
        out1 = _at(img, border_index(y + 1 + leave, height, mode), ux, uc, cval)
        out2 = _at(img, border_index(y + 2 + leave, height, mode), ux, uc, cval)
        out3 = _at(img, border_index(y + 3 + leave, height, mode), ux, uc, cval)
        acc += in0 - out0
        sums[uint64(y), ulane] = acc
        acc += in1 - out1
        sums[uint64(y + 1), ulane] = acc
        acc += in2 - out2
        sums[uint64(y + 2), ulane] = acc
        acc += in3 - out3
        sums[uint64(y + 3), ulane] = acc
        y += 4
    while y < y_end:
        acc += _at(img, border_index(y + enter, height, mode), ux, uc, cval)
        acc -= _at(img, border_index(y + leave, height, mode), ux, uc, cval)
        sums[uint64(y), ulane] = acc
        y += 1


@kernel_factory
def row_sums(exact32: bool):
    """The row pass that stages column sums in shared memory as float32 (exact32: every
    partial sum an integer below 2**24) or float64."""
    stage_type = float32 if exact32 else float64

    @cuda.jit(cache=True)
    def box_row_sums(
        sums, kw, ax, mode, row_cval, zero, area, lo, hi, is_int, tile_w, channels, out_rows
    ):
        """out[y, x, c] = sum of sums[y, (x - ax + j) * C + c] for j < kw, over area.

        out_rows is the (H, W, C) output viewed as (H, W * C).

        A block owns tile_w output pixels of one row. It stages the tile's column
        sums plus halo in shared memory, then each thread slides RUNNING_RUN outputs of one
        channel along the row (add the entering column, subtract the leaving one),
        stages the rounded results, and the block writes them out coalesced.
        """
        smem = cuda.shared.array(0, dtype=stage_type)
        width = out_rows.shape[1] // channels
        y = cuda.blockIdx.y
        x0 = cuda.blockIdx.x * tile_w
        out_w = min(tile_w, width - x0)
        n_px = out_w + kw - 1
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        uy = uint64(y)
        uch = uint64(channels)
        for p in range(tid, n_px, nthreads):
            xx = border_index(x0 - ax + p, width, mode)
            up = uint64(p) * uch
            for c in range(channels):
                if xx < 0:
                    smem[up + uint64(c)] = row_cval
                else:
                    smem[up + uint64(c)] = sums[uy, uint64(xx) * uch + uint64(c)]
        cuda.syncthreads()

        results = uint64(n_px) * uch  # staged results start after the column sums
        c = tid % channels
        xs = (tid // channels) * RUNNING_RUN
        xe = min(xs + RUNNING_RUN, out_w)
        if xs < out_w:
            first = uint64(xs) * uch + uint64(c)  # (xs, c) in the staged sums
            enter = first + uint64(kw) * uch  # the column entering after (xs, c)
            acc = zero
            for j in range(kw):
                acc += smem[first + uint64(j) * uch]
            for x in range(xs, xe):
                if x > xs:
                    acc += smem[enter]
                    acc -= smem[first]
                    enter += uch
                    first += uch
                v = acc / area  # correctly rounded: exact halves stay exact
                if is_int:
                    v = saturate_int(v, lo, hi)
                smem[results + uint64(x) * uch + uint64(c)] = v
        cuda.syncthreads()
        row_base = uint64(x0) * uch
        for i in range(tid, out_w * channels, nthreads):
            out_rows[uy, row_base + uint64(i)] = smem[results + uint64(i)]

    return box_row_sums
