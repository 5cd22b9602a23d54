"""Box filter (cv2.blur semantics) for uint8 images in two passes of running sums:
`box_twopass`, for boxes too tall or wide for `kernels.box.tiled`'s tiles.

Same contract as `kernels.box.running.box_running`: (H, W, C) uint8 device images,
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.common.border_index`
code with `cval` for the constant border. Exact: sums are integers.

1. Row pass (`box_row_sums16`): a block owns `seg_w` output pixels of one row. It loads
   their input bytes plus the horizontal halo (borders applied) into shared memory,
   the image's whole 32-bit words as they are (the row lands at its own alignment);
   thread (run, c) sums the first window of channel c, then slides it along `run`
   outputs (add the entering byte, subtract the leaving one) and stages the 16-bit sums
   (kw <= 257, so kw * 255 fits); the block writes them out as 32-bit words into an
   (H, pitch16) uint16 scratch.
2. Column pass, by default `box_column_tiles` (geometry col_groups > 0): a block loads
   a strip of the scratch and the rows its windows reach into shared memory (64-bit
   pairs of words: scratch rows are padded to a multiple of 4 lanes); a thread
   owns one 32-bit word (two lanes) of it and walks its share of the strip's output
   rows with two 32-bit running sums (add the entering row, subtract the leaving one),
   rounds each mean by one multiply-high (`kernels.common.int_ops.round_div`) and writes the
   two bytes. `box_column_means` (col_groups 0, boxes whose tile would not fit shared
   memory) does the same straight from global memory, one thread a strip.

Each pass touches a pixel a constant number of times whatever the box, so the cost
barely depends on k: the first window of a run or strip is the only part that grows
with it, and runs and strips are long. The price is the scratch: 2 bytes a lane
written and read once. Geometry: `kernels.box.plan.twopass_plan`.

This module holds the kernels (`row_kernel` and `column_tiles_kernel`, each a
`kernel_factory`, and `box_column_means`) and imports Numba; the launches
(`box_twopass`, `row_pass`, `column_pass`) are in `kernels.box.launch` (Numba-free).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, uint8, uint16, uint32, uint64

from ..common.device import border_index
from ..common.int_ops import round_div
from ..common.refs import kernel_factory

LOW16 = np.uint32(0xFFFF)
SIXTEEN = np.uint32(16)
THIRTY_TWO = np.uint64(32)


@kernel_factory
def row_kernel(channels: int, run: int):
    """The row pass for `channels` channels and runs of `run` outputs (compile-time
    constants: / C is a multiply, a run's length is known). One kernel per distinct
    arguments (`kernel_factory`)."""
    C = channels
    C_U = np.uint32(C)
    RUN = run

    @cuda.jit(cache=True)
    def box_row_sums16(src8, src32, width, kw, ax, mode, cval, seg_w, pitch16, sums32):
        """src8, src32: the (H, W, C) image flattened, and its whole 32-bit words;
        sums32: the (H, pitch16) uint16 scratch as its (H * pitch16 // 2,) 32-bit words.
        sums[y, x * C + c] = the sum of img[y, x - ax + j, c] for 0 <= j < kw, borders
        applied."""
        in8 = cuda.shared.array(0, dtype=uint8)
        in32 = cuda.shared.array(0, dtype=uint32)
        st16 = cuda.shared.array(0, dtype=uint16)
        tid = uint32(cuda.threadIdx.x)
        step = uint32(cuda.blockDim.x)
        y = cuda.blockIdx.x
        x0 = cuda.blockIdx.y * seg_w
        out_w = min(seg_w, width - x0)
        n_px = out_w + kw - 1
        n_in = uint32(n_px * C)
        left = x0 - ax
        row = uint64(y) * uint64(width * C)

        # 1. Load. The image's pixels lo .. hi - 1 are the global bytes g0 .. g1 - 1; the
        # whole 32-bit words among them go in as words (four in flight per thread), landing
        # aligned because the row starts `pre` bytes into shared memory; the few bytes
        # around those words and the halo pixels outside the image (borders applied) go
        # in one thread each. Shared byte pre + b holds the segment's byte b.
        lo = max(left, 0)
        hi = min(left + n_px, width)
        head = uint32((lo - left) * C)  # halo bytes before the image's part
        g0 = row + uint64(lo * C)
        g1 = row + uint64(max(hi, lo) * C)
        wa = (g0 + uint64(3)) >> uint64(2)  # the first whole word
        wb = max(g1 >> uint64(2), wa)  # one past the last
        n_w = uint32(wb - wa)
        # (g0 - head) mod 4, without the unsigned wrap of g0 - head at the left edge
        # (g0 < head there), which the simulator's NumPy scalars warn about.
        pre = uint32((uint32(g0 & uint64(3)) + uint32(4) - (head & uint32(3))) & uint32(3))
        d0 = uint32((pre + head + uint32(uint64(4) * wa - g0)) >> 2)
        j = tid
        while j + uint32(3 * step) < n_w:
            a = wa + uint64(j)
            v0 = src32[a]
            v1 = src32[a + uint64(step)]
            v2 = src32[a + uint64(2 * step)]
            v3 = src32[a + uint64(3 * step)]
            in32[d0 + j] = v0
            in32[d0 + j + step] = v1
            in32[d0 + j + uint32(2 * step)] = v2
            in32[d0 + j + uint32(3 * step)] = v3
            j = uint32(j + uint32(4 * step))
        while j < n_w:
            in32[d0 + j] = src32[wa + uint64(j)]
            j = uint32(j + step)
        # Bytes of the image outside those words: n_lo before, n_hi after them.
        lo_end = min(uint64(4) * wa, g1)
        hi_start = max(min(uint64(4) * wb, g1), lo_end)
        n_lo = uint32(lo_end - g0)
        n_edge = uint32(n_lo + uint32(g1 - hi_start))
        n_halo = uint32(max(lo - left, 0) + max(left + n_px - max(hi, lo), 0))
        n_img = uint32(g1 - g0)
        i = tid
        while i < n_edge + n_halo:
            if i < n_edge:
                g = g0 + uint64(i) if i < n_lo else hi_start + uint64(i - n_lo)
                in8[uint64(pre + head) + g - g0] = src8[g]
            else:
                h = i - n_edge  # halo pixel: left of the image first
                b = uint32(h * C_U) if h * C_U < head else uint32(h * C_U + n_img)
                p = b // C_U
                xx = border_index(left + int(p), width, mode)
                for c in range(C):
                    if xx < 0:
                        in8[pre + b + uint32(c)] = cval
                    else:
                        in8[pre + b + uint32(c)] = src8[row + uint64(xx * C + c)]
            i = uint32(i + step)
        cuda.syncthreads()

        # 2. Slide: thread (r, c) owns outputs r * RUN .. r * RUN + RUN - 1 of channel c.
        stage = uint32((pre + n_in + 3) // 4 * 2)  # staged sums, in 16-bit units
        r = tid // C_U
        xs = uint32(r * uint32(RUN))
        if xs < uint32(out_w):
            rel = uint32(xs * C_U + (tid - r * C_U))
            first = uint32(pre + rel)  # leaves the window next
            enter = uint32(first + uint32(kw * C))  # enters the window next
            acc = uint32(0)
            p = first
            # Compares wrap to 32 bits: Numba widens a sum of two uint32 to 64.
            while uint32(p + uint32(7 * C)) < enter:  # eight loads per wait
                b01 = uint32(in8[p]) + uint32(in8[p + C_U])
                b23 = uint32(in8[p + uint32(2 * C)]) + uint32(in8[p + uint32(3 * C)])
                b45 = uint32(in8[p + uint32(4 * C)]) + uint32(in8[p + uint32(5 * C)])
                b67 = uint32(in8[p + uint32(6 * C)]) + uint32(in8[p + uint32(7 * C)])
                acc = uint32(acc + b01 + b23 + b45 + b67)
                p = uint32(p + uint32(8 * C))
            while p < enter:
                acc = uint32(acc + in8[p])
                p = uint32(p + C_U)
            dst = uint32(stage + rel)
            st16[dst] = acc
            last = uint32(dst + min(uint32(RUN), uint32(out_w) - xs) * C_U)
            dst = uint32(dst + C_U)
            while uint32(dst + uint32(3 * C)) < last:  # four steps, loads at fixed offsets
                e0, e1 = uint32(in8[enter]), uint32(in8[enter + C_U])
                e2, e3 = uint32(in8[enter + uint32(2 * C)]), uint32(in8[enter + uint32(3 * C)])
                d0, d1 = uint32(in8[first]), uint32(in8[first + C_U])
                d2, d3 = uint32(in8[first + uint32(2 * C)]), uint32(in8[first + uint32(3 * C)])
                acc = uint32(acc + e0 - d0)
                st16[dst] = acc
                acc = uint32(acc + e1 - d1)
                st16[dst + C_U] = acc
                acc = uint32(acc + e2 - d2)
                st16[dst + uint32(2 * C)] = acc
                acc = uint32(acc + e3 - d3)
                st16[dst + uint32(3 * C)] = acc
                enter = uint32(enter + uint32(4 * C))
                first = uint32(first + uint32(4 * C))
                dst = uint32(dst + uint32(4 * C))
            while dst < last:
                acc = uint32(acc + in8[enter] - in8[first])
                st16[dst] = acc
                enter = uint32(enter + C_U)
                first = uint32(first + C_U)
                dst = uint32(dst + C_U)
        cuda.syncthreads()

        # 3. Store: whole 32-bit words (x0 * C is even; an odd last lane pairs with the
        # row's padding lane).
        n_words_out = uint32((out_w * C + 1) // 2)
        base32 = (uint64(y) * uint64(pitch16) + uint64(x0 * C)) // uint64(2)
        w0 = stage // uint32(2)
        i = tid
        while i + uint32(3 * step) < n_words_out:  # four stores in flight
            v0, v1 = in32[w0 + i], in32[w0 + i + step]
            v2, v3 = in32[w0 + i + uint32(2 * step)], in32[w0 + i + uint32(3 * step)]
            a = base32 + uint64(i)
            sums32[a] = v0
            sums32[a + uint64(step)] = v1
            sums32[a + uint64(2 * step)] = v2
            sums32[a + uint64(3 * step)] = v3
            i = uint32(i + uint32(4 * step))
        while i < n_words_out:
            sums32[base32 + uint64(i)] = in32[w0 + i]
            i = uint32(i + step)

    return box_row_sums16


@cuda.jit(device=True)
def _lanes_of(sums32, r, height, mode, uwords, q, row_cval, inside):
    """The two lanes of word q of scratch row r: read directly where the block is
    `inside`, else through the border (row_cval for the constant border)."""
    if not inside:
        r = border_index(r, height, mode)
        if r < 0:
            return row_cval, row_cval
    w = sums32[uint64(r) * uwords + uint64(q)]
    return w & LOW16, w >> SIXTEEN


@cuda.jit(device=True)
def _slide(a0, a1, e0, e1, d0, d1):
    """Both running sums one row on: add the entering lanes, subtract the leaving ones."""
    return uint32(a0 + e0 - d0), uint32(a1 + e1 - d1)


@cuda.jit(device=True)
def _emit(out, o, a0, a1, second, area, magic, shift_hi, even):
    """Write the rounded means of both lanes at out[o] and out[o + 1] (if `second`)."""
    out[o] = round_div(a0, area, magic, shift_hi, even)
    if second:
        out[o + uint64(1)] = round_div(a1, area, magic, shift_hi, even)


@cuda.jit(device=True)
def _advance(out, o, a0, a1, e, d, second, area, magic, shift_hi, even):
    """Slide both running sums one row (e: the entering word, d: the leaving one),
    write their means at out[o] (and out[o + 1]) and return them."""
    a0 = uint32(a0 + (e & LOW16) - (d & LOW16))
    a1 = uint32(a1 + (e >> SIXTEEN) - (d >> SIXTEEN))
    _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
    return a0, a1


@cuda.jit(device=True)
def _rows8(sums32, off, uwords):
    """Words `off` + i * uwords of the scratch for i < 8, all eight loads issued at once."""
    return (
        sums32[off], sums32[off + uwords], sums32[off + uint64(2) * uwords],
        sums32[off + uint64(3) * uwords], sums32[off + uint64(4) * uwords],
        sums32[off + uint64(5) * uwords], sums32[off + uint64(6) * uwords],
        sums32[off + uint64(7) * uwords],
    )  # fmt: skip


@cuda.jit(device=True)
def _low8(w0, w1, w2, w3, w4, w5, w6, w7):
    """The sum of the low 16-bit lanes of eight words."""
    lo = (w0 & LOW16) + (w1 & LOW16) + (w2 & LOW16) + (w3 & LOW16)
    return uint32(lo + (w4 & LOW16) + (w5 & LOW16) + (w6 & LOW16) + (w7 & LOW16))


@cuda.jit(device=True)
def _high8(w0, w1, w2, w3, w4, w5, w6, w7):
    """The sum of the high 16-bit lanes of eight words."""
    hi = (w0 >> SIXTEEN) + (w1 >> SIXTEEN) + (w2 >> SIXTEEN) + (w3 >> SIXTEEN)
    return uint32(hi + (w4 >> SIXTEEN) + (w5 >> SIXTEEN) + (w6 >> SIXTEEN) + (w7 >> SIXTEEN))


@cuda.jit(cache=True)
def box_column_means(sums32, height, lanes, words, kh, ay, mode, row_cval, area, magic,
                     shift_hi, even, strip, out):  # fmt: skip
    """out (the (H, W, C) image flattened, `lanes` = W * C a row) = round(the sum of
    kh rows of sums from row y - ay / area), borders applied; `words` = pitch16 // 2
    32-bit words a scratch row."""
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if 2 * q >= lanes:
        return
    row_cval, area, magic = uint32(row_cval), uint32(area), uint32(magic)
    shift_hi, even = uint32(shift_hi), even != 0
    y0 = cuda.blockIdx.y * strip
    y_end = min(y0 + strip, height)
    top = y0 - ay
    lane = uint64(2 * q)
    second = 2 * q + 1 < lanes
    uwords = uint64(words)
    a0 = uint32(0)
    a1 = uint32(0)
    inside = top >= 0 and y_end - 1 - ay + kh <= height
    i = 0
    if inside:  # sixteen, then eight rows at a time: one wait for memory each
        off = uint64(top) * uwords + uint64(q)
        while i + 15 < kh:
            w0, w1, w2, w3, w4, w5, w6, w7 = _rows8(sums32, off, uwords)
            v0, v1, v2, v3, v4, v5, v6, v7 = _rows8(sums32, off + uint64(8) * uwords, uwords)
            a0 = uint32(a0 + _low8(w0, w1, w2, w3, w4, w5, w6, w7))
            a0 = uint32(a0 + _low8(v0, v1, v2, v3, v4, v5, v6, v7))
            a1 = uint32(a1 + _high8(w0, w1, w2, w3, w4, w5, w6, w7))
            a1 = uint32(a1 + _high8(v0, v1, v2, v3, v4, v5, v6, v7))
            off += uint64(16) * uwords
            i += 16
        while i + 7 < kh:
            w0, w1, w2, w3, w4, w5, w6, w7 = _rows8(sums32, off, uwords)
            a0 = uint32(a0 + _low8(w0, w1, w2, w3, w4, w5, w6, w7))
            a1 = uint32(a1 + _high8(w0, w1, w2, w3, w4, w5, w6, w7))
            off += uint64(8) * uwords
            i += 8
    for r in range(i, kh):
        v0, v1 = _lanes_of(sums32, top + r, height, mode, uwords, q, row_cval, False)
        a0 = uint32(a0 + v0)
        a1 = uint32(a1 + v1)
    o = uint64(y0) * uint64(lanes) + lane
    _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
    y = y0 + 1
    if inside:
        # Sixteen, then eight rows at a time, all loads issued before the sums use them.
        enter = uint64(top + kh) * uwords + uint64(q)
        leave = uint64(top) * uwords + uint64(q)
        step = uint64(lanes)
        while y + 15 < y_end:  # thirty-two loads in flight
            e0, e1, e2, e3, e4, e5, e6, e7 = _rows8(sums32, enter, uwords)
            e8, e9, e10, e11, e12, e13, e14, e15 = _rows8(
                sums32, enter + uint64(8) * uwords, uwords
            )
            d0, d1, d2, d3, d4, d5, d6, d7 = _rows8(sums32, leave, uwords)
            d8, d9, d10, d11, d12, d13, d14, d15 = _rows8(
                sums32, leave + uint64(8) * uwords, uwords
            )
            for e, d in ((e0, d0), (e1, d1), (e2, d2), (e3, d3), (e4, d4), (e5, d5), (e6, d6),
                         (e7, d7), (e8, d8), (e9, d9), (e10, d10), (e11, d11), (e12, d12),
                         (e13, d13), (e14, d14), (e15, d15)):  # fmt: skip
                o += step
                a0, a1 = _advance(out, o, a0, a1, e, d, second, area, magic, shift_hi, even)
            enter += uint64(16) * uwords
            leave += uint64(16) * uwords
            y += 16
        while y + 7 < y_end:
            e0, e1, e2, e3, e4, e5, e6, e7 = _rows8(sums32, enter, uwords)
            d0, d1, d2, d3, d4, d5, d6, d7 = _rows8(sums32, leave, uwords)
            for e, d in ((e0, d0), (e1, d1), (e2, d2), (e3, d3),
                         (e4, d4), (e5, d5), (e6, d6), (e7, d7)):  # fmt: skip
                o += step
                a0, a1 = _advance(out, o, a0, a1, e, d, second, area, magic, shift_hi, even)
            enter += uint64(8) * uwords
            leave += uint64(8) * uwords
            y += 8
    while y < y_end:
        e0, e1 = _lanes_of(sums32, y - ay + kh - 1, height, mode, uwords, q, row_cval, False)
        d0, d1 = _lanes_of(sums32, y - ay - 1, height, mode, uwords, q, row_cval, False)
        a0, a1 = _slide(a0, a1, e0, e1, d0, d1)
        o += uint64(lanes)
        _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
        y += 1


@cuda.jit(device=True)
def _pair_or(sums64, i, upairs, qp, row_pair):
    """Pair qp of scratch row i, or row_pair (the constant border) where i < 0."""
    if i < 0:
        return row_pair
    return sums64[uint64(i) * upairs + qp]


@cuda.jit(device=True)
def _tile_pair(sums64, r, height, mode, upairs, qp, row_pair, inside):
    """Pair qp of scratch row r, read directly where the block is `inside`, else through
    the border (row_pair, every lane row_cval, for the constant border)."""
    if not inside:
        r = border_index(r, height, mode)
        if r < 0:
            return row_pair
    return sums64[uint64(r) * upairs + qp]


@cuda.jit(device=True)
def _store8(tile, p, step, w0, w1, w2, w3, w4, w5, w6, w7):
    """tile[p + i * step] = w_i for i < 8 (rows `step` elements apart)."""
    tile[p] = w0
    tile[p + step] = w1
    tile[p + uint32(2) * step] = w2
    tile[p + uint32(3) * step] = w3
    tile[p + uint32(4) * step] = w4
    tile[p + uint32(5) * step] = w5
    tile[p + uint32(6) * step] = w6
    tile[p + uint32(7) * step] = w7


@kernel_factory
def column_tiles_kernel(wx: int):
    """`box_column_tiles` for blocks `wx` words wide (a compile-time constant, so that
    the tile's row offsets fold into the shared-memory loads). One kernel per distinct
    arguments (`kernel_factory`)."""
    WX = np.uint32(wx)
    HX = np.uint32(wx // 2)  # pairs of words a tile row

    @cuda.jit(cache=True)
    def box_column_tiles(sums32, height, lanes, words, kh, ay, mode, row_cval, area, magic,
                         shift_hi, even, strip, out):  # fmt: skip
        """As `box_column_means`, by tiles. A block of WX words x G = blockDim.y
        threads owns `strip` output rows of WX scratch words:
        1. it loads their rows of sums and the kh - 1 more their windows reach (borders
           applied) into shared memory, (strip + kh - 1) x WX words, as 64-bit pairs of
           words (WX even, scratch rows a multiple of 4 lanes), every thread's loads
           independent of each other (eight in flight, at the borders too);
        2. thread (x, g) sums the first window of its s = strip // G output rows from shared
           memory and slides it over them, one mean per row and lane.
        A block reads its rows of the scratch (strip + kh - 1) / strip times (through L2:
        neighbouring strips share them); the re-summed first windows come from shared
        memory. Needs 4 * (strip + kh - 1) * WX bytes of dynamic shared memory."""
        tile = cuda.shared.array(0, dtype=uint32)
        tile64 = cuda.shared.array(0, dtype=uint64)  # the same bytes, as pairs of words
        sums64 = sums32.view(np.uint64)
        x = uint32(cuda.threadIdx.x)
        g = uint32(cuda.threadIdx.y)
        wx = WX
        n_groups = uint32(cuda.blockDim.y)
        q = int(cuda.blockIdx.x * WX + cuda.threadIdx.x)  # int64, like words
        y0 = cuda.blockIdx.y * strip
        top = y0 - ay
        out_rows = min(strip, height - y0)
        n_rows = uint32(out_rows + kh - 1)
        row_cval = uint32(row_cval)
        row_word = row_cval | (row_cval << SIXTEEN)
        row_pair = uint64(row_word) | (uint64(row_word) << THIRTY_TWO)

        # 1. Load: row r of the tile is scratch row top + r, HX pairs of words. The
        # block's threads take the pairs in row-major order, `rows` rows a round: thread
        # t loads pair t % HX of rows t // HX, + rows, + 2 rows, ...
        t = g * WX + x
        dx = t % HX
        rows = uint32(n_groups * uint32(2))  # n_groups * WX // HX
        upairs = uint64(words // 2)  # a scratch row's pairs (its pitch is a multiple of 4 lanes)
        qp = min(uint64(cuda.blockIdx.x * HX) + uint64(dx), upairs - uint64(1))  # past the
        # last pair, threads load a real one that no thread uses
        inside = top >= 0 and top + int(n_rows) <= height
        r = t // HX
        r8 = uint32(8) * rows
        if not inside:  # rows through the border, eight loads in flight
            while uint32(r + r8 - rows) < n_rows:
                i0 = border_index(top + int(r), height, mode)
                i1 = border_index(top + int(r + rows), height, mode)
                i2 = border_index(top + int(r + uint32(2) * rows), height, mode)
                i3 = border_index(top + int(r + uint32(3) * rows), height, mode)
                i4 = border_index(top + int(r + uint32(4) * rows), height, mode)
                i5 = border_index(top + int(r + uint32(5) * rows), height, mode)
                i6 = border_index(top + int(r + uint32(6) * rows), height, mode)
                i7 = border_index(top + int(r + uint32(7) * rows), height, mode)
                w0 = _pair_or(sums64, i0, upairs, qp, row_pair)
                w1 = _pair_or(sums64, i1, upairs, qp, row_pair)
                w2 = _pair_or(sums64, i2, upairs, qp, row_pair)
                w3 = _pair_or(sums64, i3, upairs, qp, row_pair)
                w4 = _pair_or(sums64, i4, upairs, qp, row_pair)
                w5 = _pair_or(sums64, i5, upairs, qp, row_pair)
                w6 = _pair_or(sums64, i6, upairs, qp, row_pair)
                w7 = _pair_or(sums64, i7, upairs, qp, row_pair)
                _store8(tile64, r * HX + dx, rows * HX, w0, w1, w2, w3, w4, w5, w6, w7)
                r = uint32(r + r8)
        else:
            base = uint64(top) * upairs + qp
            while uint32(r + r8 - rows) < n_rows:  # eight loads in flight
                w0 = sums64[base + uint64(r) * upairs]
                w1 = sums64[base + uint64(r + rows) * upairs]
                w2 = sums64[base + uint64(r + uint32(2) * rows) * upairs]
                w3 = sums64[base + uint64(r + uint32(3) * rows) * upairs]
                w4 = sums64[base + uint64(r + uint32(4) * rows) * upairs]
                w5 = sums64[base + uint64(r + uint32(5) * rows) * upairs]
                w6 = sums64[base + uint64(r + uint32(6) * rows) * upairs]
                w7 = sums64[base + uint64(r + uint32(7) * rows) * upairs]
                _store8(tile64, r * HX + dx, rows * HX, w0, w1, w2, w3, w4, w5, w6, w7)
                r = uint32(r + r8)
            while r + uint32(3) * rows < n_rows:
                w0 = sums64[base + uint64(r) * upairs]
                w1 = sums64[base + uint64(r + rows) * upairs]
                w2 = sums64[base + uint64(r + uint32(2) * rows) * upairs]
                w3 = sums64[base + uint64(r + uint32(3) * rows) * upairs]
                tile64[r * HX + dx] = w0
                tile64[(r + rows) * HX + dx] = w1
                tile64[(r + uint32(2) * rows) * HX + dx] = w2
                tile64[(r + uint32(3) * rows) * HX + dx] = w3
                r = uint32(r + uint32(4) * rows)
        while r < n_rows:
            tile64[r * HX + dx] = _tile_pair(sums64, top + int(r), height, mode, upairs, qp,
                                             row_pair, inside)  # fmt: skip
            r = uint32(r + rows)
        cuda.syncthreads()

        # 2. Slide over output rows y0 + g * s .. + s - 1.
        s = uint32(strip) // n_groups
        first = g * s
        if 2 * q >= lanes or int(first) >= out_rows:
            return
        area, magic, shift_hi, even = uint32(area), uint32(magic), uint32(shift_hi), even != 0
        second = 2 * q + 1 < lanes
        # The window's words summed whole (mod 2**32) and their high lanes: the low
        # lanes' sum is the difference (below 2**32 for kh < 65537).
        whole = uint32(0)
        a1 = uint32(0)
        p = first * wx + x
        end = uint32(p + uint32(kh) * wx)
        while uint32(p + uint32(7) * wx) < end:  # eight rows per step: independent loads
            w0, w1 = tile[p], tile[p + wx]
            w2, w3 = tile[p + uint32(2) * wx], tile[p + uint32(3) * wx]
            w4, w5 = tile[p + uint32(4) * wx], tile[p + uint32(5) * wx]
            w6, w7 = tile[p + uint32(6) * wx], tile[p + uint32(7) * wx]
            whole = uint32(whole + w0 + w1 + w2 + w3)
            whole = uint32(whole + w4 + w5 + w6 + w7)
            a1 = uint32(a1 + (w0 >> SIXTEEN) + (w1 >> SIXTEEN) + (w2 >> SIXTEEN) + (w3 >> SIXTEEN))
            a1 = uint32(a1 + (w4 >> SIXTEEN) + (w5 >> SIXTEEN) + (w6 >> SIXTEEN) + (w7 >> SIXTEEN))
            p = uint32(p + uint32(8) * wx)
        while p < end:
            w0 = tile[p]
            whole = uint32(whole + w0)
            a1 = uint32(a1 + (w0 >> SIXTEEN))
            p = uint32(p + wx)
        a0 = uint32(whole - (a1 << SIXTEEN))
        o = uint64(y0 + int(first)) * uint64(lanes) + uint64(2 * q)
        _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
        leave = first * wx + x
        last = min(first + s, uint32(out_rows)) * wx + x  # one past the last leaving row
        step = uint64(lanes)
        while uint32(leave + wx) < last:
            o += step
            a0, a1 = _advance(out, o, a0, a1, tile[leave + uint32(kh) * wx], tile[leave], second,
                              area, magic, shift_hi, even)  # fmt: skip
            leave = uint32(leave + wx)

    return box_column_tiles
