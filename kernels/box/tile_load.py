"""Phase 1 of `kernels.box.tiled`: a tile's input rows into shared memory.

`make_loader(channels, ksize, tile_w, tile_h, threads)` returns the device function
`load(in32, src8, src32, n_words, height, width, left, top, mode, cval, tid)`: the
(tile_h + kh - 1) input rows of (tile_w + kw - 1) * C byte lanes from pixel `left`,
row `top` on, as 32-bit words in shared memory (`in32`, rows of an odd number of
words, `kernels.box.plan.tiled_layout`'s in_words). Thread (r, q) loads word q of rows
r, r + T // nq, ...; every load of a thread is issued before any is used. Tiles whose
columns all lie inside the image (interior tiles, and the tiles along the top and
bottom edges) read each word as two aligned loads and a funnel shift, rows outside
the image mapped through the border rule (a row of `cval` for the constant border);
tiles along the left and right edges gather bytes through the border mapping. The
caller synchronises afterwards.

Also the helpers the kernels share: `reciprocal` and `div` (division by a
compile-time constant as one 32 x 32-bit multiply-high) and `byte_at`.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint32, uint64

from ..common.device import border_index
from .lanes import lane_column

EIGHT = np.uint32(8)
SIXTEEN = np.uint32(16)
TWENTY_FOUR = np.uint32(24)


@cuda.jit(device=True)
def byte_at(src8, row_off, col, cval):
    """The byte at mapped column `col` of the row at `row_off` (-1 either: `cval`)."""
    if row_off < 0 or col < 0:
        return uint32(cval)
    return uint32(src8[uint64(row_off + col)])  # unsigned: no negative-index wrap


def reciprocal(d: int) -> np.uint64:
    """m with (n * m) >> 32 == n // d for every n * d < 2**32 (m = ceil(2**32 / d):
    the error n * (m * d - 2**32) / (d * 2**32) stays below 1 / d)."""
    return np.uint64(-(-(1 << 32) // d))


@cuda.jit(device=True)
def div(n, m):
    """n // d for small n, with m = reciprocal(d): one 32 x 32-bit multiply-high
    (Numba's own division by a constant runs in 64 bits)."""
    return uint64((uint64(uint32(n)) * m) >> uint64(32))


def make_loader(channels: int, ksize: tuple, tile_w: int, tile_h: int, threads: int):
    """The load device function for one specialisation (see the module docstring)."""
    C = channels
    KH, KW = ksize
    IN_LANES = (tile_w + KW - 1) * C
    NQ = (IN_LANES + 3) // 4  # words loaded per input row
    IN_WORDS = NQ | 1
    IN_ROWS = tile_h + KH - 1
    ROW_STEP = threads // NQ  # input rows one sweep of the block loads
    LOAD_ITERS = (IN_ROWS + ROW_STEP - 1) // ROW_STEP
    FULL_SWEEPS = IN_ROWS // ROW_STEP  # sweeps whose rows all exist
    STEP32 = np.uint32(ROW_STEP)
    # Index arithmetic is unsigned 64-bit: Numba adds a negative-index wraparound to
    # every signed index, and 32-bit wrapping keeps constant offsets out of the loads.
    U = np.uint64
    NQ_U, IN_WORDS_U, IN_ROWS_U, ROW_STEP_U = U(NQ), U(IN_WORDS), U(IN_ROWS), U(ROW_STEP)
    FOUR_U = U(4)
    BY_NQ = reciprocal(NQ)

    @cuda.jit(device=True, inline="always")
    def funnel(src32, a):
        """The 32-bit word at byte offset `a` (any alignment): two aligned loads."""
        wi = uint32(a >> 2)
        lo = uint64(src32[wi])
        hi = uint64(src32[uint32(wi + 1)])
        shift = uint64(uint32(a & 3) * uint32(8))
        return uint32(((hi << U(32)) | lo) >> shift)

    @cuda.jit(device=True, inline="always")
    def load(in32, src8, src32, n_words, height, width, left, top, mode, cval, tid):
        pitch = width * C
        r = div(tid, BY_NQ)
        q = tid - r * NQ_U
        word_end = left * C + 4 * NQ
        # Whole words of every row the tile reads, the word after each included.
        columns_inside = (
            left >= 0 and word_end <= pitch and ((height - 1) * pitch + word_end) // 4 < n_words
        )
        rows_inside = top >= 0 and top + IN_ROWS <= height
        if r < ROW_STEP_U:  # a partial sweep of rows would load words twice
            if columns_inside and rows_inside:
                # 32-bit byte offsets (the image is < 2 GiB), one multiply-add per row.
                a0 = uint32(uint32((top + int64(r)) * pitch + left * C) + uint32(FOUR_U * q))
                step = uint32(STEP32 * uint32(pitch))
                dst = r * IN_WORDS_U + q
                for i in range(LOAD_ITERS):
                    if i < FULL_SWEEPS or r + U(i * ROW_STEP) < IN_ROWS_U:
                        word = funnel(src32, uint32(a0 + uint32(i) * step))
                        in32[dst + U(i * ROW_STEP * IN_WORDS)] = word
            elif columns_inside:
                # Rows through the border rule; a row outside is cval in every byte.
                col = uint32(uint32(left * C) + uint32(FOUR_U * q))
                fill = uint32(cval) * uint32(0x01010101)
                rr = r
                while rr < IN_ROWS_U:
                    yy = border_index(top + int64(rr), height, mode)
                    word = fill
                    if yy >= 0:
                        word = funnel(src32, uint32(uint32(yy) * uint32(pitch) + col))
                    in32[rr * IN_WORDS_U + q] = word
                    rr += ROW_STEP_U
            else:
                lane = int64(FOUR_U * q)
                c0 = lane_column(lane, IN_LANES, left, width, C, mode)
                c1 = lane_column(lane + 1, IN_LANES, left, width, C, mode)
                c2 = lane_column(lane + 2, IN_LANES, left, width, C, mode)
                c3 = lane_column(lane + 3, IN_LANES, left, width, C, mode)
                rr = r
                while rr < IN_ROWS_U:
                    yy = border_index(top + int64(rr), height, mode)
                    ro = -1 if yy < 0 else yy * pitch
                    b0 = byte_at(src8, ro, c0, cval)
                    b1 = byte_at(src8, ro, c1, cval)
                    b2 = byte_at(src8, ro, c2, cval)
                    b3 = byte_at(src8, ro, c3, cval)
                    word = uint32(b0 | (b1 << EIGHT) | (b2 << SIXTEEN) | (b3 << TWENTY_FOUR))
                    in32[rr * IN_WORDS_U + q] = word
                    rr += ROW_STEP_U

    return load
