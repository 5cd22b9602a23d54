"""Box filter (cv2.blur semantics) for uint8 images, four bytes per load and sixteen per
store: `box_packed`.

Same contract as `kernels.box_fused.box_fused` for uint8 (H, W, C) device images of 1
to 4 channels: out[y, x, c] = round(box sum / area) half to even, borders by
`kernels.border_index` code with `cval` for the constant border; exact. Boxes of 2 to
257 rows (a column sum of 257 bytes fits 16 bits).

A block owns `tile_w` output pixels of a strip of `strip` rows, viewed as bytes of the
(H, W * C) image, and works in batches of `batch` rows:
- Vertical phase: each thread owns one 32-bit word (4 byte lanes) of the tile's input
  span (its outputs plus the (kw - 1)-pixel halo) and keeps the word's four column
  sums in two registers as 16-bit pairs (bytes 0 and 2, bytes 1 and 3), so one add
  updates two sums and one add-subtract slides them down a row. Inside the image a
  word of a row is two aligned loads and a funnel shift (rows of W * C bytes need
  not be 4-byte aligned). The batch's sums go to shared memory as uint16.
- Horizontal phase: thread (row tid % batch, run tid // batch) slides C running sums,
  one per channel, over `run` consecutive output bytes of its row, starting at a
  16-byte aligned byte of the output image, and stores each 16 bytes it produces with
  one 128-bit store (the partial 16 bytes at a tile row's two ends byte by byte). The
  mean is one multiply-high of the sum plus a bias (`kernels.box_plan.packed_magic`);
  boxes of even area also round exact halves to even.
The input is read once from DRAM (halo words and the leaving row hit the caches) and
the output written once; there is no scratch image and no staging of the output.
Blocks whose rows and words all lie inside the image read without border logic; the
others map rows and, for words at the image's left and right edges, single bytes.
Geometry: `kernels.box_plan.packed_plan` (Numba-free, shared with the quick start).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32, uint8, uint16, uint32, uint64
from numba.cuda import libdevice

from .box_fused import _lane_column
from .box_plan import PACKED_MARGIN, packed_args, packed_pitch, packed_plan
from .device import border_index
from .packs import store_words4

BYTES = np.uint32(0x00FF00FF)  # bytes 0 and 2 of a word, as two 16-bit lanes
LOW16 = np.uint32(0x0000FFFF)
HIGH16 = np.uint32(0xFFFF0000)
ONES = np.uint32(0x01010101)
BYTE = np.uint32(0xFF)
LOW4 = np.uint32(0xFFFFFFF0)  # rounds a byte offset down to 16
ONE = np.uint32(1)
TWO = np.uint32(2)
THREE = np.uint32(3)
FOUR = np.uint32(4)
EIGHT = np.uint32(8)
SIXTEEN = np.uint32(16)
TWENTY_FOUR = np.uint32(24)
U1, U2, U3, U4, U8, U12, U16 = (np.uint64(v) for v in (1, 2, 3, 4, 8, 12, 16))


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


@cuda.jit(device=True)
def _byte_at(src8, row_off, col, cval):
    if row_off < 0 or col < 0:
        return uint32(cval)
    return uint32(src8[uint32(row_off + col)])


@cuda.jit(device=True)
def _funnel(src32, a):
    """The four bytes at byte offset `a` of the image, from the two aligned words that
    hold them (both must be whole words of the image)."""
    wi = a >> TWO
    lo = uint64(src32[wi])
    hi = uint64(src32[wi + ONE])
    return uint32(((hi << uint64(32)) | lo) >> uint64((a & THREE) << THREE))


@cuda.jit(device=True)
def _word_at(src8, src32, nw, row_off, col, fast, c0, c1, c2, c3, cval):
    """The four lanes of a word in the row at `row_off` (-1: constant border): a funnel
    of aligned loads where all four bytes lie in the row and whole words of the image
    (`fast`; `col` = the first lane's byte column), else byte by byte from the lanes'
    mapped columns c0..c3 (-1: constant border)."""
    if row_off < 0:
        return uint32(cval) * ONES
    if fast:
        a = uint32(row_off + col)
        if (a >> TWO) + ONE < nw:
            return _funnel(src32, a)
    b0 = _byte_at(src8, row_off, c0, cval)
    b1 = _byte_at(src8, row_off, c1, cval)
    b2 = _byte_at(src8, row_off, c2, cval)
    b3 = _byte_at(src8, row_off, c3, cval)
    return b0 | (b1 << EIGHT) | (b2 << SIXTEEN) | (b3 << TWENTY_FOUR)


@cuda.jit(device=True)
def _slide(lo, hi, enter, leave):
    """The 16-bit pair sums (lo: bytes 0 and 2, hi: bytes 1 and 3) after adding the
    word `enter` and removing `leave`; exact while every sum stays in [0, 2**16)."""
    lo = uint32(lo + (enter & BYTES) - (leave & BYTES))
    hi = uint32(hi + ((enter >> EIGHT) & BYTES) - ((leave >> EIGHT) & BYTES))
    return lo, hi


@cuda.jit(device=True)
def _edge_word(out8, a, row0, end, w):
    """Store the bytes of word `w` (output bytes a .. a + 3) that lie in [row0, end)."""
    for i in range(4):
        if a + uint32(i) >= row0 and a + uint32(i) < end:
            out8[a + uint32(i)] = uint8((w >> uint32(8 * i)) & BYTE)


def _make_box_packed(channels: int, threads: int, batch: int, even: bool, shifted: bool):
    """The kernel for `channels` channels, `threads` per block, `batch` rows between
    barriers, an even (ties possible) or odd box area, and a quotient shift (boxes
    above 64x64) or none."""
    C = channels
    T = threads
    R_U = np.uint32(batch)
    C_U = np.uint32(C)
    PITCH_U = np.uint32(packed_pitch(T))
    MARGIN_U = np.uint32(PACKED_MARGIN)

    @cuda.jit(device=True)
    def splat(v):
        """A tuple of C copies of v: the channels' running sums."""
        if C == 1:
            return (v,)
        if C == 2:
            return (v, v)
        if C == 3:
            return (v, v, v)
        return (v, v, v, v)

    @cuda.jit(device=True)
    def mean(acc, area, magic, shift):
        """round(sum / area) for acc = sum + area // 2: floor(acc / area) by a
        multiply-high, an exact half (even area only) rounded to the even side."""
        q = uint32(libdevice.umulhi(acc, magic))
        if shifted:
            q = q >> shift
        if even:
            if uint32(acc - uint32(q * area)) == 0:
                q = uint32(q - (q & ONE))
        return q

    @cuda.jit(device=True)
    def step(sums, p, e, state, area, magic, shift):
        """The mean of the first running sum in `state`, and the state for the next
        byte: that sum slid one pixel (add column sum e, drop p) moved to the back."""
        a = state[0]
        m = mean(a, area, magic, shift)
        return m, state[1:] + (uint32(a + sums[e] - sums[p]),)

    @cuda.jit(device=True)
    def word(sums, p, e, state, area, magic, shift):
        """Four consecutive output bytes as one word, and the state after them."""
        m0, state = step(sums, p, e, state, area, magic, shift)
        m1, state = step(sums, p + U1, e + U1, state, area, magic, shift)
        m2, state = step(sums, p + U2, e + U2, state, area, magic, shift)
        m3, state = step(sums, p + U3, e + U3, state, area, magic, shift)
        # Adds rather than ors (the means are below 256): each pair is one shift-add.
        low = uint32(m0 + uint32(m1 << EIGHT))
        high = uint32(m2 + uint32(m3 << EIGHT))
        return uint32(low + uint32(high << SIXTEEN)), state

    @cuda.jit(device=True)
    def window(sums, p, kw, bias):
        """The C running sums (plus bias) of the windows of the bytes p .. p + C - 1."""
        state = splat(uint32(bias))
        q = p
        i = int32(0)
        while i < kw:
            for _ in range(C):  # each channel's next column sum, in turn
                state = state[1:] + (uint32(state[0] + sums[q]),)
                q += U1
            i += 1
        return state

    @cuda.jit(device=True)
    def store(sums32, g, s0, lo, hi):
        """The word's four column sums, in lane order, into shared row g."""
        base = uint32(uint32(g) * PITCH_U + MARGIN_U + s0) >> ONE
        sums32[base] = uint32((lo & LOW16) | (hi << SIXTEEN))
        sums32[base + ONE] = uint32((lo >> SIXTEEN) | (hi & HIGH16))

    @cuda.jit(cache=True)
    def box_packed(src8, src32, n_words, height, width, kh, kw, ay, ax, mode, cval, area,
                   magic, shift, bias, tile_w, run, strip, out8, out32):  # fmt: skip
        """src8/out8: the image as flat bytes; src32/out32: its whole 32-bit words."""
        sums = cuda.shared.array(0, dtype=uint16)
        sums32 = cuda.shared.array(0, dtype=uint32)  # the same memory, two sums a word
        tid = int32(cuda.threadIdx.x)
        nw = uint32(n_words)
        area32 = uint32(area)
        magic32 = uint32(magic)
        shift32 = uint32(shift)
        pitch = int32(width * C)
        x0 = int32(cuda.blockIdx.x * tile_w)
        out_w = min(int32(tile_w), int32(width) - x0)
        n_span = int32((out_w + kw - 1) * C)  # input lanes: outputs plus halo
        left = x0 - int32(ax)
        l0 = left * C  # byte column of lane 0 (negative left of the image)
        s0 = 4 * tid  # this thread's first lane
        col = l0 + s0
        used = s0 < n_span
        fast = used and col >= 0 and col + 4 <= pitch
        c0 = int32(_lane_column(s0, n_span, left, width, C, mode))
        c1 = int32(_lane_column(s0 + 1, n_span, left, width, C, mode))
        c2 = int32(_lane_column(s0 + 2, n_span, left, width, C, mode))
        c3 = int32(_lane_column(s0 + 3, n_span, left, width, C, mode))

        y0 = int32(cuda.blockIdx.y * strip)
        y_end = min(y0 + int32(strip), int32(height))
        top = y0 - int32(ay)
        last_row = y_end - 1 - int32(ay) + int32(kh) - 1
        inside = top >= 0 and last_row < int32(height)
        # Interior blocks (rows inside the image, every used word inside its row and
        # the image's whole words) read by funnel without any checks; a thread without
        # a word of the span re-reads the first.
        span_end = l0 + 4 * ((n_span + 3) // 4)
        interior = (
            inside and l0 >= 0 and span_end <= pitch
            and uint32(last_row * pitch + span_end) >> TWO < nw
        )  # fmt: skip
        colr = col if used else l0

        lo = uint32(0)  # column sums of lanes 0 and 2, 16 bits each
        hi = uint32(0)  # lanes 1 and 3
        if interior:
            off = int32(top * pitch)
            r = int32(0)
            while r + 1 < kh:  # two rows at a time, all four loads first
                w = _funnel(src32, uint32(off + colr))
                v = _funnel(src32, uint32(off + pitch + colr))
                lo = uint32(lo + (w & BYTES) + (v & BYTES))
                hi = uint32(hi + ((w >> EIGHT) & BYTES) + ((v >> EIGHT) & BYTES))
                off = int32(off + 2 * pitch)
                r += 2
            if r < kh:
                w = _funnel(src32, uint32(off + colr))
                lo = uint32(lo + (w & BYTES))
                hi = uint32(hi + ((w >> EIGHT) & BYTES))
        else:
            r = int32(0)
            while r < kh:
                off = _row_offset(top + r, height, pitch, mode, inside)
                w = _word_at(src8, src32, nw, off, col, fast, c0, c1, c2, c3, cval)
                lo = uint32(lo + (w & BYTES))
                hi = uint32(hi + ((w >> EIGHT) & BYTES))
                r += 1
        enter = int32((top + kh) * pitch)  # interior: the row entering next
        leave = int32(top * pitch)  # interior: the row leaving next

        s0u = uint32(s0)
        x0c = uint32(x0 * C)
        nb = uint32(out_w * C)  # output bytes of a tile row
        kwc = uint32(kw * C)
        run_u = uint32(run)
        g_h = uint32(tid) % R_U  # horizontal phase: this thread's row in the batch
        j_h = uint32(tid) // R_U  # ... and its run in that row
        yb = y0  # first row of the batch
        while yb < y_end:
            rows = min(int32(R_U), y_end - yb)
            g = int32(0)
            if yb == y0:  # the strip's first row: sums already complete
                store(sums32, 0, s0u, lo, hi)
                g = 1
            if interior:
                while g + 1 < rows:  # two rows at a time, all eight loads first
                    e0 = _funnel(src32, uint32(enter + colr))
                    o0 = _funnel(src32, uint32(leave + colr))
                    e1 = _funnel(src32, uint32(enter + pitch + colr))
                    o1 = _funnel(src32, uint32(leave + pitch + colr))
                    lo, hi = _slide(lo, hi, e0, o0)
                    store(sums32, g, s0u, lo, hi)
                    lo, hi = _slide(lo, hi, e1, o1)
                    store(sums32, g + 1, s0u, lo, hi)
                    enter = int32(enter + 2 * pitch)
                    leave = int32(leave + 2 * pitch)
                    g += 2
                if g < rows:
                    e0 = _funnel(src32, uint32(enter + colr))
                    o0 = _funnel(src32, uint32(leave + colr))
                    lo, hi = _slide(lo, hi, e0, o0)
                    store(sums32, g, s0u, lo, hi)
                    enter = int32(enter + pitch)
                    leave = int32(leave + pitch)
            else:
                while g < rows:
                    y = yb + g
                    e = _row_offset(y - ay + kh - 1, height, pitch, mode, inside)
                    o = _row_offset(y - ay - 1, height, pitch, mode, inside)
                    we = _word_at(src8, src32, nw, e, col, fast, c0, c1, c2, c3, cval)
                    wo = _word_at(src8, src32, nw, o, col, fast, c0, c1, c2, c3, cval)
                    lo, hi = _slide(lo, hi, we, wo)
                    store(sums32, g, s0u, lo, hi)
                    g += 1
            cuda.syncthreads()
            # Horizontal: slide over `run` bytes of row g_h from a 16-byte aligned start.
            if g_h < uint32(rows):
                row0 = uint32(uint32(yb + int32(g_h)) * uint32(pitch) + x0c)  # first output
                end = uint32(row0 + nb)
                cs = uint32((row0 & LOW4) + j_h * run_u)
                if cs < end:
                    # Shared indices as uint64: the constant offsets below then fold into
                    # the loads' immediates (uint32 sums could wrap, so they would not).
                    p = uint64(uint32(g_h * PITCH_U + MARGIN_U + cs) - row0)  # leaving sum
                    e = uint64(p + kwc)  # entering sum
                    state = window(sums, p, kw, bias)
                    stop = min(uint32(cs + run_u), end)
                    while cs < stop:
                        w0, state = word(sums, p, e, state, area32, magic32, shift32)
                        w1, state = word(sums, p + U4, e + U4, state, area32, magic32, shift32)
                        w2, state = word(sums, p + U8, e + U8, state, area32, magic32, shift32)
                        w3, state = word(sums, p + U12, e + U12, state, area32, magic32, shift32)
                        if cs >= row0 and uint32(cs + SIXTEEN) <= end:
                            store_words4(out32, cs >> TWO, w0, w1, w2, w3)
                        else:  # a tile row's first or last 16 bytes
                            _edge_word(out8, cs, row0, end, w0)
                            _edge_word(out8, cs + FOUR, row0, end, w1)
                            _edge_word(out8, cs + EIGHT, row0, end, w2)
                            _edge_word(out8, cs + uint32(12), row0, end, w3)
                        cs = uint32(cs + SIXTEEN)
                        p += U16
                        e += U16
            cuda.syncthreads()
            yb += rows

    return box_packed


_KERNELS: dict = {}


def kernel_for(channels: int, threads: int, batch: int, even: bool, shifted: bool):
    """The compiled-on-demand kernel for this specialisation (kept per process)."""
    key = (channels, threads, batch, bool(even), bool(shifted))
    if key not in _KERNELS:
        _KERNELS[key] = _make_box_packed(*key)
    return _KERNELS[key]


def words(flat):
    """The whole 32-bit words of a flat uint8 device array (its last n % 4 bytes are
    left out), as a uint32 device array over the same memory."""
    n4 = flat.shape[0] // 4
    return flat[: 4 * n4].view(np.uint32)


def aligned(arr) -> bool:
    """Whether a device array starts on a 16-byte boundary (the kernel's 128-bit stores
    and 32-bit loads assume it; fresh allocations are 256-byte aligned). The
    simulator's arrays are NumPy arrays underneath, accessed element by element."""
    try:
        return arr.device_ctypes_pointer.value % 16 == 0
    except AttributeError:
        return True


def box_packed(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None):
    """Box filter of a uint8 (H, W, C) device image, four bytes per load (see the
    module docstring); `geometry` from `kernels.box_plan.packed_plan`. Raises
    ValueError when the plan says the case is not handled or an array is not 16-byte
    aligned.
    """
    height, width, channels = img.shape
    geo = geometry or packed_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_packed handles uint8 images of 1 to 4 channels, boxes of 2 to 257 rows")
    if out is None:
        out = cuda.device_array(img.shape, dtype=img.dtype)
    if not (aligned(img) and aligned(out)):
        raise ValueError("box_packed needs 16-byte aligned device arrays")
    n = height * width * channels
    src, dst = img.reshape(n), out.reshape(n)
    kernel = kernel_for(channels, geo["threads"], geo["batch"], geo["even"], geo["shifted"])
    args = packed_args(img.shape, ksize, anchor, mode, cval, geo)
    kernel[geo["grid"], geo["threads"], 0, geo["smem"]](
        src, words(src), n // 4, *args, dst, words(dst)
    )
    return out
