"""Box filter (cv2.blur semantics) for uint8 images, one tile at a time: `box_tiled`.

Same contract as `kernels.box.launch.box_fused` for uint8 (H, W, C) device images:
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.common.border_index`
code with `cval` for the constant border; exact.

A block owns an output tile of `tile_h` rows and `tile_w` pixels and sums the box
columns first, in four phases between barriers, with no state carried between tiles:
1. Load (`kernels.box.tile_load`): the tile's input (tile_h + kh - 1 rows of
   (tile_w + kw - 1) * C byte lanes) into shared memory as 32-bit words, every load
   of a thread issued before any is used (box_fused and box_packed walk down strips
   one row of loads at a time and were measured latency-bound, BENCHMARKS.md).
   Interior tiles read each word as two aligned loads and a funnel shift; tiles
   touching a border gather bytes through the border mapping.
2. Vertical: thread (g, q) keeps the sums of word q's four byte lanes over kh rows as
   two words of two 16-bit lanes (kh * 255 < 2**16, so one 32-bit add or subtract
   serves two lanes and no lane carries into the next), slides down the rows of
   group g and stores the column sums as 16-bit lanes in natural order.
3. Horizontal: each item slides a window over `run` outputs of one channel of one
   output row of column sums (32-bit sums), rounds each mean by a multiply-high and
   stages the byte in shared memory, at the byte offset the row has in the image
   modulo 4.
4. Store: each warp copies whole 32-bit words of a staged row to the image's
   aligned words (bytes one at a time at a row's ends and outside whole words; a
   plain copy where every row of the tile starts on a word and fills whole words).
The image and the output must start on a 4-byte boundary; `kernels.box.dispatch.box_choice`
sends other views to box_fused. Many small blocks are resident per SM, so one block's
loads overlap another's arithmetic. The halo is re-read per tile (from L2), so the
tile must be large next to the box: `kernels.box.plan.tiled_plan` declines boxes too
big for its tiles. (A rows-first kernel once stood beside this one; with
`kernels.box.plan.TILED_MAX_BOX` at 31 the planner never chose it, so it was deleted.)

This module holds the kernel (`tiled_kernel`, a `kernel_factory`) and imports Numba;
`box_tiled`, the launch, is in `kernels.box.launch` (Numba-free).
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda, uint8, uint16, uint32, uint64

from ..common.int_ops import byte_perm, round_div
from ..common.refs import kernel_factory
from .plan import packed_magic, tiled_layout
from .tile_load import div, make_loader, reciprocal

SIMULATOR = bool(config.ENABLE_CUDASIM)
HELD_MAX = 24  # column sums a horizontal item keeps in registers at most
ZERO = np.uint32(0)
LANES01 = np.uint32(0x4140)  # byte_perm selectors: bytes 0, 1 (2, 3) of x, each
LANES23 = np.uint32(0x4342)  # followed by byte 4 (a zero y)


@cuda.jit(device=True)
def _lanes01(w):
    """Bytes 0 and 1 of w as two 16-bit lanes (one prmt)."""
    return byte_perm(w, ZERO, LANES01)


@cuda.jit(device=True)
def _lanes23(w):
    """Bytes 2 and 3 of w as two 16-bit lanes (one prmt)."""
    return byte_perm(w, ZERO, LANES23)


@kernel_factory
def tiled_kernel(channels: int, ksize: tuple, threads: int, run: int, tile_w: int,
                 tile_h: int, groups: int, min_blocks: int):  # fmt: skip
    """The kernel for one specialisation: `channels`, the box `ksize` = (kh, kw) (a
    tuple of ints), and the geometry of `kernels.box.plan.tiled_plan` (threads per
    block, outputs per horizontal slide, tile_w x tile_h output pixels per tile, row
    groups of the vertical phase, min_blocks > 0: CUDA launch bounds). Every size is a
    compile-time constant. One kernel per distinct arguments (`kernel_factory`)."""
    C = channels
    KH, KW = ksize
    T, RUN, TW, TH, G = threads, run, tile_w, tile_h, groups
    AREA = KH * KW
    EVEN = AREA % 2 == 0
    magic, shift_hi = packed_magic(AREA, 511 * AREA + 1)
    AREA_U, MAGIC_U, SHIFT_U = np.uint32(AREA), np.uint32(magic), np.uint32(shift_hi)
    L = tiled_layout(C, ksize, TW, TH)
    NQ, IN_WORDS, OS_WORDS = L["nq"], L["in_words"], L["os_words"]
    VS0, VS_WORDS = L["vs0"], L["vs_words"]
    PER_GROUP = (TH + G - 1) // G
    FULL_GROUPS = TH % G == 0  # every group has PER_GROUP rows: no row guard
    V_ITEMS = G * NQ
    FULL_RUNS = TW // RUN
    # A full run's column sums held in registers where they are few (narrow boxes).
    N_HELD = RUN + KW - 1
    HELD = N_HELD <= HELD_MAX
    LAST_RUN = TW - FULL_RUNS * RUN
    N_ITEMS = TH * C * ((TW + RUN - 1) // RUN)
    ITEM_ITERS = (N_ITEMS + T - 1) // T
    SW = min(T, 32)  # threads per output row in the store phase
    ROW_SLOTS = T // SW
    STORE_ROWS = (TH + ROW_SLOTS - 1) // ROW_SLOTS
    STORE_WORDS = (OS_WORDS + SW - 1) // SW
    RAGGED_ITERS = (8 + SW - 1) // SW
    ROW_WORDS = TW * C // 4  # a full output row's words, when it has whole words only
    WORD_ROWS = TW * C % 4 == 0
    ROW_WORD_ITERS = (ROW_WORDS + SW - 1) // SW
    U = np.uint64
    NQ_U, IN_WORDS_U = U(NQ), U(IN_WORDS)
    VS0_U, VS_WORDS_U, VS_PITCH_U = U(VS0), U(VS_WORDS), U(2 * VS_WORDS)
    OS_WORDS_U, OS_PITCH_U, TH_U = U(OS_WORDS), U(4 * OS_WORDS), U(TH)
    ROW_WORDS_U = U(ROW_WORDS)
    C_U, RUN_U, FULL_RUNS_U, N_ITEMS_U = U(C), U(RUN), U(FULL_RUNS), U(N_ITEMS)
    PER_GROUP_U, V_ITEMS_U, SW_U = U(PER_GROUP), U(V_ITEMS), U(SW)
    ONE_U, TWO_U, FOUR_U, EIGHT_U = U(1), U(2), U(4), U(8)
    BY_NQ, BY_TH, BY_C = (reciprocal(d) for d in (NQ, TH, C))
    load = make_loader(C, ksize, TW, TH, T)
    bounds = {"launch_bounds": (T, min_blocks)} if min_blocks and not SIMULATOR else {}

    @cuda.jit(cache=True, **bounds)
    def box_tiled(src8, src32, n_words, height, width, kh, kw, ay, ax, mode, cval, area,
                  magic, shift_hi, tile_w, tile_h, groups, out8, out32):  # fmt: skip
        """src8/out8: the image and the output as flat bytes; src32/out32: their whole
        32-bit words. kh, kw, area, magic, shift_hi, tile_w, tile_h and groups are the
        specialisation's own constants (kept in the signature the launchers share)."""
        in32 = cuda.shared.array(0, dtype=uint32)
        sh8 = cuda.shared.array(0, dtype=uint8)
        vs16 = cuda.shared.array(0, dtype=uint16)
        tid = uint64(cuda.threadIdx.x)
        pitch = width * C
        x0 = cuda.blockIdx.x * TW
        y0 = cuda.blockIdx.y * TH
        left = x0 - ax
        top = y0 - ay

        # 1. Load (kernels.box.tile_load).
        load(in32, src8, src32, n_words, height, width, left, top, mode, cval, tid)
        cuda.syncthreads()

        # 2. Vertical: thread (g, q) slides word q's column sums down the rows of group g.
        g = div(tid, BY_NQ)
        first = g * PER_GROUP_U
        if tid < V_ITEMS_U and (FULL_GROUPS or first < TH_U):  # ceil(TH / G) rows a group
            q = tid - g * NQ_U
            src = first * IN_WORDS_U + q
            s01 = uint32(0)
            s23 = uint32(0)
            for i in range(KH):
                w = in32[src + U(i * IN_WORDS)]
                s01 = uint32(s01 + _lanes01(w))
                s23 = uint32(s23 + _lanes23(w))
            dst = VS0_U + first * VS_WORDS_U + TWO_U * q
            in32[dst] = s01
            in32[dst + ONE_U] = s23
            for y in range(1, PER_GROUP):
                if FULL_GROUPS or first + U(y) < TH_U:
                    e = in32[src + U((y + KH - 1) * IN_WORDS)]
                    d = in32[src + U((y - 1) * IN_WORDS)]
                    s01 = uint32(s01 + _lanes01(e) - _lanes01(d))
                    s23 = uint32(s23 + _lanes23(e) - _lanes23(d))
                    in32[dst + U(y * VS_WORDS)] = s01
                    in32[dst + U(y * VS_WORDS + 1)] = s23
        cuda.syncthreads()

        # 3. Horizontal: item (rr, c, run) slides over one run of channel c of output row
        # rr (consecutive threads take consecutive rows: rows start in different banks)
        # and stages the bytes at the row's offset in the image modulo 4.
        row0 = uint32(uint32(y0) * uint32(pitch) + uint32(x0 * C))
        for it in range(ITEM_ITERS):
            item = tid + U(it * T)
            if item < N_ITEMS_U:
                rest = div(item, BY_TH)
                rr = item - rest * TH_U
                ri = div(rest, BY_C)
                c = rest - ri * C_U
                xs = ri * RUN_U
                leaving = TWO_U * VS0_U + rr * VS_PITCH_U + xs * C_U + c
                align = U(uint32(row0 + uint32(rr) * uint32(pitch)) & uint32(3))
                dst = rr * OS_PITCH_U + align + xs * C_U + c
                if HELD and ri < FULL_RUNS_U:
                    # Every column sum of the run read once, into registers, before the
                    # byte stores (which the compiler must assume may overwrite them).
                    held = cuda.local.array(N_HELD, uint32)
                    for j in range(N_HELD):
                        held[j] = uint32(vs16[leaving + U(j * C)])
                    acc = uint32(0)
                    for j in range(KW):
                        acc = uint32(acc + held[j])
                    sh8[dst] = round_div(acc, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                    for k in range(1, RUN):
                        acc = uint32(acc + held[k - 1 + KW] - held[k - 1])
                        sh8[dst + U(k * C)] = round_div(acc, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                    continue
                acc = uint32(0)
                for j in range(KW):
                    acc = uint32(acc + vs16[leaving + U(j * C)])
                sh8[dst] = round_div(acc, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                if ri < FULL_RUNS_U:
                    for k in range(1, RUN):
                        enter = vs16[leaving + U((k - 1 + KW) * C)]
                        acc = uint32(acc + enter - vs16[leaving + U((k - 1) * C)])
                        sh8[dst + U(k * C)] = round_div(acc, AREA_U, MAGIC_U, SHIFT_U, EVEN)
                else:
                    for k in range(1, LAST_RUN):
                        enter = vs16[leaving + U((k - 1 + KW) * C)]
                        acc = uint32(acc + enter - vs16[leaving + U((k - 1) * C)])
                        sh8[dst + U(k * C)] = round_div(acc, AREA_U, MAGIC_U, SHIFT_U, EVEN)
        cuda.syncthreads()

        # 4. Store: SW threads per output row (one warp) copy the row's staged words to
        # the image's whole words; the bytes outside them (at most three at each end of
        # the row, and the image's last n % 4 bytes) go one at a time.
        out_h = uint64(min(TH, height - y0))
        n_bytes = uint32(min(TW, width - x0) * C)
        slot = tid // SW_U
        lane = tid - slot * SW_U
        if (
            WORD_ROWS
            and uint32(pitch) & uint32(3) == 0
            and row0 & uint32(3) == 0
            and (x0 + TW <= width)
        ):
            # Rows that start on a word and fill whole words (most images): a copy.
            for i in range(STORE_ROWS):
                rr = slot + U(i * ROW_SLOTS)
                if rr < out_h:
                    w0 = uint32(uint32(row0 + uint32(rr) * uint32(pitch)) >> 2)
                    staged = rr * OS_WORDS_U
                    for j in range(ROW_WORD_ITERS):
                        wi = lane + U(j * SW)
                        if ROW_WORDS % SW == 0 or wi < ROW_WORDS_U:
                            out32[uint32(w0 + uint32(wi))] = in32[staged + wi]
            return
        for i in range(STORE_ROWS):
            rr = slot + U(i * ROW_SLOTS)
            if rr < out_h:
                g0 = uint32(row0 + uint32(rr) * uint32(pitch))
                end = uint32(g0 + n_bytes)
                w0 = uint32(g0 >> 2)
                whole_lo = uint32(uint32(g0 + 3) >> 2)  # first and past-last whole word
                whole_hi = min(uint32(end >> 2), uint32(n_words))
                staged = rr * OS_WORDS_U
                for j in range(STORE_WORDS):
                    w = uint32(w0 + uint32(lane + U(j * SW)))
                    if w >= whole_lo and w < whole_hi:
                        out32[w] = in32[staged + U(w - w0)]
                if g0 & 3 or end & 3 or whole_hi < end >> 2:
                    head_end = uint32(min(whole_lo * 4, end))
                    tail = uint32(max(whole_hi * 4, head_end))
                    for j in range(RAGGED_ITERS):
                        k = lane + U(j * SW)  # 0-3: the head's bytes, 4-7: the tail's
                        at = uint32(g0 + uint32(k))
                        if k >= FOUR_U:
                            at = uint32(tail + uint32(k - FOUR_U))
                        if k < EIGHT_U and (at < head_end or (k >= FOUR_U and at < end)):
                            out8[at] = sh8[rr * OS_PITCH_U + U(at - uint32(w0 * 4))]

    return box_tiled
