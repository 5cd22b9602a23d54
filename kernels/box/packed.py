"""Box filter (cv2.blur semantics) for uint8 images, four bytes per load: `box_packed`.

Same contract as `kernels.box.launch.box_fused` for uint8 (H, W, C) device images:
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.common.border_index`
code with `cval` for the constant border; exact. Boxes up to 257 rows (a column sum
of 257 bytes fits 16 bits).

The design is box_fused's (a block owns `tile_w` outputs of a strip of rows; vertical
running sums in registers, horizontal slides in shared memory, rounded means staged
and written coalesced), with the work per byte cut where box_fused spent it:
- The image is read as 32-bit words, each thread holding two words (8 byte lanes) of
  the (H, W * C) row. A word's four column sums live in two registers as 16-bit
  pairs (bytes 0 and 2 in one, 1 and 3 in the other), so one add updates two sums.
  Inside the image each row's word is two aligned loads and a funnel shift (by zero
  bytes where W * C is a multiple of 4), all loads of a row step issued together.
- Offsets are 32-bit; run length, channel count and words per thread are
  compile-time constants, so a full run of outputs is straight-line code.
- The rounded means are staged so that each row's 4-byte-aligned words can be
  stored whole; the at most six bytes at a row's ends are stored one by one.
Lanes at the image's left and right edges, rows outside it, and words past the end
of the image gather their bytes one at a time with the border mapping.
Geometry: `kernels.box.plan.packed_plan` (Numba-free).

On the H100 it is exact but not faster than box_fused so far (2167x2495x3, k=21: 80
us at best vs 69 us); BENCHMARKS.md has the profiles. `kernels.box.dispatch.box_auto` runs it
only where box_fused's tile cannot hold the box.

This module holds the kernel (`packed_kernel`, a `kernel_factory`) and imports Numba;
`box_packed`, the launch, is in `kernels.box.launch` (Numba-free).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32, uint8, uint16, uint32, uint64

from ..common.device import border_index
from ..common.refs import kernel_factory
from .lanes import lane_column

BYTES = np.uint32(0x00FF00FF)  # bytes 0 and 2 of a word, as two 16-bit lanes
LOW16 = np.uint32(0x0000FFFF)
HIGH16 = np.uint32(0xFFFF0000)
EIGHT = np.uint32(8)
SIXTEEN = np.uint32(16)
TWO = np.uint32(2)
THREE = np.uint32(3)
ONES = np.uint32(0x01010101)
ONE = np.uint32(1)
TWENTY_FOUR = np.uint32(24)


@cuda.jit(device=True)
def _row_offset(p, height, pitch, mode, inside):
    """Offset of row p (border-mapped unless the block's rows are `inside`), or -1 for
    the constant border."""
    if inside:
        return int32(p * pitch)
    yy = border_index(p, height, mode)
    if yy < 0:
        return int32(-1)
    return int32(yy * pitch)


@kernel_factory
def packed_kernel(channels: int, run: int, threads: int, even: bool):
    """The kernel for `channels` channels, `run` outputs per slide, `threads` per
    block, and an even (ties possible) or odd box area. One kernel per distinct
    arguments (`kernel_factory`)."""
    C = channels
    RUN = run
    T = threads
    NL = 8 * T  # byte lanes per block row: two words per thread
    HALF_ROW = np.uint32(NL // 2)  # 32-bit words of column sums per block row
    WORD1 = np.uint32(2 * T)  # offset of a thread's second word's sums
    RUN_U = np.uint32(RUN)
    C_U = np.uint32(C)
    T_U = np.uint32(T)
    NL_U = np.uint32(NL)
    LANES_U = np.uint32(min(T, 32))  # the write-out's threads per row
    WARPS_U = np.uint32(max(T // 32, 1))  # rows written at a time

    @cuda.jit(device=True)
    def byte_at(src8, row_off, col, cval):
        if col < 0:
            return uint32(cval)
        return uint32(src8[uint32(row_off + col)])

    @cuda.jit(device=True)
    def word_at(src8, src32, nw, row_off, col, fast, c0, c1, c2, c3, cval):
        """The four lanes of a word in the row at `row_off` (-1: constant border): one
        or two aligned loads where all four bytes lie in the row (`fast`; `col` = the
        first lane's byte column), else byte by byte from the lanes' mapped columns."""
        if row_off < 0:
            return uint32(cval) * ONES
        if fast:
            a = uint32(row_off + col)
            wi = a >> TWO
            s = a & THREE
            if s == 0:
                return src32[wi]
            if wi + ONE < nw:
                lo = uint64(src32[wi])
                hi = uint64(src32[wi + ONE])
                return uint32(((hi << uint64(32)) | lo) >> uint64(8 * s))
        b0 = byte_at(src8, row_off, c0, cval)
        b1 = byte_at(src8, row_off, c1, cval)
        b2 = byte_at(src8, row_off, c2, cval)
        b3 = byte_at(src8, row_off, c3, cval)
        return b0 | (b1 << EIGHT) | (b2 << SIXTEEN) | (b3 << TWENTY_FOUR)

    @cuda.jit(device=True)
    def row_words(src32, row_off, col0, col1):
        """A thread's two words of an interior row: four aligned loads, issued together,
        and a funnel shift each (by 0 bytes where the row is aligned)."""
        a = uint32(row_off + col0)
        wi = a >> TWO
        s = uint64(EIGHT * (a & THREE))
        wj = uint32(row_off + col1) >> TWO
        p0 = uint64(src32[wi])
        q0 = uint64(src32[wi + ONE])
        p1 = uint64(src32[wj])
        q1 = uint64(src32[wj + ONE])
        w0 = uint32(((q0 << uint64(32)) | p0) >> s)
        w1 = uint32(((q1 << uint64(32)) | p1) >> s)
        return w0, w1

    @cuda.jit(device=True)
    def mean(acc, area, magic, shift_hi):
        """round(acc / area), half to even: floor(t / (2 area)) for t = 2 acc + area by
        a multiply-high (see box_plan.packed_magic), a tie rounded to the even side."""
        t = uint32(2 * acc + area)
        q = uint32((uint64(t) * uint64(magic)) >> uint64(32)) >> shift_hi
        if even:
            if uint32(t - q * uint32(2 * area)) == 0:
                q -= q & uint32(1)
        return q

    @cuda.jit(cache=True)
    def box_packed(src8, src32, n_words, height, width, kh, kw, ay, ax, mode, cval, area,
                   magic, shift_hi, tile_w, strip, batch, out8, out32):  # fmt: skip
        """src8/out8: the image as flat bytes; src32/out32: its whole 32-bit words."""
        sums16 = cuda.shared.array(0, dtype=uint16)
        sums32 = cuda.shared.array(0, dtype=uint32)
        stage8 = cuda.shared.array(0, dtype=uint8)
        tid = int32(cuda.threadIdx.x)
        area32 = uint32(area)
        magic32 = uint32(magic)
        shift32 = uint32(shift_hi)
        nw = uint32(n_words)
        pitch = int32(width * C)
        x0 = int32(cuda.blockIdx.x * tile_w)
        out_w = min(int32(tile_w), int32(width) - x0)
        n_lanes = int32((out_w + kw - 1) * C)
        left = x0 - int32(ax)
        l0 = left * C  # byte column of lane 0 (negative left of the image)
        lane0 = 4 * tid
        lane1 = 4 * (tid + T)
        used1 = lane1 < n_lanes
        fast0 = lane0 < n_lanes and l0 + lane0 >= 0 and l0 + lane0 + 4 <= pitch
        fast1 = used1 and l0 + lane1 >= 0 and l0 + lane1 + 4 <= pitch
        col0 = l0 + lane0
        col1 = l0 + lane1
        # Mapped byte columns of the eight lanes, for words read byte by byte.
        c00 = int32(lane_column(lane0, n_lanes, left, width, C, mode))
        c01 = int32(lane_column(lane0 + 1, n_lanes, left, width, C, mode))
        c02 = int32(lane_column(lane0 + 2, n_lanes, left, width, C, mode))
        c03 = int32(lane_column(lane0 + 3, n_lanes, left, width, C, mode))
        c10 = int32(lane_column(lane1, n_lanes, left, width, C, mode))
        c11 = int32(lane_column(lane1 + 1, n_lanes, left, width, C, mode))
        c12 = int32(lane_column(lane1 + 2, n_lanes, left, width, C, mode))
        c13 = int32(lane_column(lane1 + 3, n_lanes, left, width, C, mode))

        y0 = int32(cuda.blockIdx.y * strip)
        y_end = min(y0 + int32(strip), int32(height))
        top = y0 - int32(ay)
        inside = top >= 0 and y_end - 1 - int32(ay) + int32(kh) <= int32(height)

        # Interior blocks (rows inside the image, every used word inside its row and
        # the image) read whole words without any checks; a thread's unused second
        # word then re-reads its first.
        last_col = l0 + 4 * ((n_lanes + 3) // 4)  # past the tile's last word
        last_row = y_end - 1 - int32(ay) + int32(kh) - 1
        interior = (
            inside and l0 >= 0 and last_col <= pitch
            and uint32(last_row * pitch + last_col) // uint32(4) < nw
        )  # fmt: skip
        col1i = col1 if used1 else col0

        # Column sums of rows top .. top + kh - 1, as 16-bit pairs.
        lo0 = uint32(0)
        hi0 = uint32(0)
        lo1 = uint32(0)
        hi1 = uint32(0)
        if interior:
            off = int32(top * pitch)
            r = int32(0)
            while r + 1 < kh:  # two rows at a time, all eight loads first
                w0, w1 = row_words(src32, off, col0, col1i)
                v0, v1 = row_words(src32, off + pitch, col0, col1i)
                lo0 = uint32(lo0 + (w0 & BYTES) + (v0 & BYTES))
                hi0 = uint32(hi0 + ((w0 >> EIGHT) & BYTES) + ((v0 >> EIGHT) & BYTES))
                lo1 = uint32(lo1 + (w1 & BYTES) + (v1 & BYTES))
                hi1 = uint32(hi1 + ((w1 >> EIGHT) & BYTES) + ((v1 >> EIGHT) & BYTES))
                off = int32(off + 2 * pitch)
                r = int32(r + 2)
            if r < kh:
                w0, w1 = row_words(src32, off, col0, col1i)
                lo0 = uint32(lo0 + (w0 & BYTES))
                hi0 = uint32(hi0 + ((w0 >> EIGHT) & BYTES))
                lo1 = uint32(lo1 + (w1 & BYTES))
                hi1 = uint32(hi1 + ((w1 >> EIGHT) & BYTES))
        else:
            r = int32(0)
            while r < kh:
                off = _row_offset(top + r, height, pitch, mode, inside)
                w0 = word_at(src8, src32, nw, off, col0, fast0, c00, c01, c02, c03, cval)
                lo0 = uint32(lo0 + (w0 & BYTES))
                hi0 = uint32(hi0 + ((w0 >> EIGHT) & BYTES))
                if used1:
                    w1 = word_at(src8, src32, nw, off, col1, fast1, c10, c11, c12, c13, cval)
                    lo1 = uint32(lo1 + (w1 & BYTES))
                    hi1 = uint32(hi1 + ((w1 >> EIGHT) & BYTES))
                r += 1
        enter = int32((top + kh) * pitch)  # interior: offset of the row entering next
        leave = int32(top * pitch)  # interior: offset of the row leaving next

        sums_u = uint32(batch * NL * 2)  # staged means follow the column sums
        stage_u = uint32(((tile_w * C + 3) // 4 + 1) * 4)  # bytes per staged row
        per_row = uint32(C * ((out_w + RUN - 1) // RUN))  # horizontal items per row
        pitch_u = uint32(pitch)
        x0c = uint32(x0 * C)
        outc = uint32(out_w * C)
        out_w_u = uint32(out_w)
        kwc = uint32(kw * C)
        lane = uint32(tid) % LANES_U
        warp = uint32(tid) // LANES_U
        g = int32(0)  # row within the batch
        yb = y0  # first row of the batch
        y = y0
        while y < y_end:
            if y > y0:  # slide down one row: add the entering row, drop the leaving one
                if interior:
                    e0, e1 = row_words(src32, enter, col0, col1i)
                    o0, o1 = row_words(src32, leave, col0, col1i)
                    enter = int32(enter + pitch)
                    leave = int32(leave + pitch)
                else:
                    e = _row_offset(y - ay + kh - 1, height, pitch, mode, inside)
                    o = _row_offset(y - ay - 1, height, pitch, mode, inside)
                    e0 = word_at(src8, src32, nw, e, col0, fast0, c00, c01, c02, c03, cval)
                    o0 = word_at(src8, src32, nw, o, col0, fast0, c00, c01, c02, c03, cval)
                    e1 = uint32(0)
                    o1 = uint32(0)
                    if used1:
                        e1 = word_at(src8, src32, nw, e, col1, fast1, c10, c11, c12, c13, cval)
                        o1 = word_at(src8, src32, nw, o, col1, fast1, c10, c11, c12, c13, cval)
                lo0 = uint32(lo0 + (e0 & BYTES) - (o0 & BYTES))
                hi0 = uint32(hi0 + ((e0 >> EIGHT) & BYTES) - ((o0 >> EIGHT) & BYTES))
                lo1 = uint32(lo1 + (e1 & BYTES) - (o1 & BYTES))
                hi1 = uint32(hi1 + ((e1 >> EIGHT) & BYTES) - ((o1 >> EIGHT) & BYTES))
            # The four sums of each word, in lane order, as two 32-bit stores.
            base = uint32(g) * HALF_ROW + uint32(2 * tid)
            sums32[base] = uint32((lo0 & LOW16) | (hi0 << SIXTEEN))
            sums32[base + ONE] = uint32((lo0 >> SIXTEEN) | (hi0 & HIGH16))
            sums32[base + WORD1] = uint32((lo1 & LOW16) | (hi1 << SIXTEEN))
            sums32[base + WORD1 + ONE] = uint32((lo1 >> SIXTEEN) | (hi1 & HIGH16))
            g += 1
            y += 1
            if g < batch and y < y_end:
                continue
            cuda.syncthreads()
            # Horizontal: each item slides over RUN outputs of one channel of one row.
            # 32-bit unsigned arithmetic throughout: Numba would otherwise widen these
            # to 64 bits and add wraparound code to every signed index.
            rows = uint32(g)
            row0 = uint32(uint32(yb) * pitch_u + x0c)  # byte offset of the batch's first output
            n_items = uint32(rows * per_row)
            item = uint32(tid)
            while item < n_items:
                gi = uint32(item // per_row)
                rest = uint32(item - gi * per_row)
                ri = uint32(rest // C_U)
                c = uint32(rest - ri * C_U)
                xs = uint32(ri * RUN_U)
                out_lane = uint32(gi * NL_U + xs * C_U + c)  # lane of the sum leaving next
                in_lane = uint32(out_lane + kwc)  # lane of the sum entering next
                acc = uint32(0)
                p = out_lane
                while p < in_lane:
                    acc = uint32(acc + sums16[p])
                    p = uint32(p + C_U)
                phase = uint32(row0 + gi * pitch_u) & THREE
                dst = uint32(sums_u + gi * stage_u + phase + xs * C_U + c)
                if xs + RUN_U <= out_w_u:
                    k = uint32(0)
                    while k < RUN_U:  # a full run: a constant trip count
                        stage8[dst + k * C_U] = mean(acc, area32, magic32, shift32)
                        acc = uint32(acc + sums16[in_lane + k * C_U] - sums16[out_lane + k * C_U])
                        k += ONE
                else:
                    k = uint32(0)
                    while k < out_w_u - xs:
                        stage8[uint32(dst + k * C_U)] = mean(acc, area32, magic32, shift32)
                        enter_k = uint32(in_lane + k * C_U)
                        acc = uint32(acc + sums16[enter_k] - sums16[uint32(out_lane + k * C_U)])
                        k = uint32(k + ONE)
                item = uint32(item + T_U)
            cuda.syncthreads()
            # Write the staged rows, one warp per row: whole aligned words, then the at
            # most six bytes at the row's ends.
            gi = warp
            while gi < rows:
                row_start = uint32(row0 + gi * pitch_u)
                row_end = uint32(row_start + outc)
                staged = uint32(sums_u + gi * stage_u + (row_start & THREE))  # row_start's byte
                w_first = uint32(row_start + THREE) >> TWO
                w_end = min(row_end >> TWO, nw)
                if w_end <= w_first:  # no whole word: all bytes one by one
                    w_end = w_first
                    head_end = row_end
                else:
                    head_end = uint32(w_first << TWO)
                wi = uint32(w_first + lane)
                while wi < w_end:
                    out32[wi] = sums32[uint32(staged + ((wi << TWO) - row_start)) >> TWO]
                    wi = uint32(wi + LANES_U)
                n_head = uint32(head_end - row_start)
                tail = max(w_end << TWO, head_end)
                n_tail = uint32(row_end - tail) if row_end > tail else uint32(0)
                i = lane
                while i < n_head + n_tail:  # one pass unless a row has fewer than 6 lanes
                    a = uint32(row_start + i) if i < n_head else uint32(tail + i - n_head)
                    out8[a] = stage8[uint32(staged + (a - row_start))]
                    i = uint32(i + LANES_U)
                gi = uint32(gi + WARPS_U)
            g = 0
            yb = y

    return box_packed
