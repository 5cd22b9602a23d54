"""Box filter (cv2.blur semantics) for uint8 images in two passes of running sums:
`box_twopass`, for boxes too tall or wide for `kernels.box_tiled`'s tiles.

Same contract as `kernels.box.box_running`: (H, W, C) uint8 device images,
out[y, x, c] = round(box sum / area) half to even, borders by `kernels.border_index`
code with `cval` for the constant border. Exact: sums are integers.

1. Row pass (`box_row_sums16`): a block owns `seg_w` output pixels of one row. It loads
   their input bytes plus the horizontal halo (borders applied) into shared memory;
   thread (run, c) sums the first window of channel c, then slides it along `run`
   outputs (add the entering byte, subtract the leaving one) and stages the 16-bit sums
   (kw <= 257, so kw * 255 fits); the block writes them out as 32-bit words into an
   (H, pitch16) uint16 scratch.
2. Column pass (`box_column_means`): a thread owns one 32-bit word (two lanes) of the
   scratch and walks `strip` output rows with two 32-bit running sums (add the entering
   row, subtract the leaving one), rounds each mean by one multiply-high
   (`kernels.int_ops.round_div`) and writes the two bytes.

Each pass touches a pixel a constant number of times whatever the box, so the cost
barely depends on k: the first window of a run or strip is the only part that grows
with it, and runs and strips are long. The price is the scratch: 2 bytes a lane
written and read once. Geometry: `kernels.box_plan.twopass_plan`.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, uint8, uint16, uint32, uint64

from .box_plan import packed_magic, twopass_plan
from .device import border_index
from .int_ops import round_div
from .launch import scratch

LOW16 = np.uint32(0xFFFF)
SIXTEEN = np.uint32(16)


def _make_row_sums(channels: int):
    """The row pass for `channels` channels (a compile-time constant: / C is a multiply)."""
    C = channels
    C_U = np.uint32(C)

    @cuda.jit(cache=True)
    def box_row_sums16(src, width, kw, ax, mode, cval, run, seg_w, pitch16, sums32):
        """src: the (H, W, C) image flattened; sums32: the (H, pitch16) uint16 scratch
        as its (H * pitch16 // 2,) 32-bit words. sums[y, x * C + c] = the sum of
        img[y, x - ax + j, c] for 0 <= j < kw, borders applied."""
        in8 = cuda.shared.array(0, dtype=uint8)
        st16 = cuda.shared.array(0, dtype=uint16)
        st32 = cuda.shared.array(0, dtype=uint32)
        tid = uint32(cuda.threadIdx.x)
        step = uint32(cuda.blockDim.x)
        y = cuda.blockIdx.x
        x0 = cuda.blockIdx.y * seg_w
        out_w = min(seg_w, width - x0)
        n_px = out_w + kw - 1
        n_in = uint32(n_px * C)
        left = x0 - ax
        row = uint64(y) * uint64(width * C)

        # Load: the segment's input bytes and halo, consecutive threads on consecutive bytes.
        i = tid
        if left >= 0 and left + n_px <= width:
            base = row + uint64(left * C)
            while i < n_in:
                in8[i] = src[base + uint64(i)]
                i = uint32(i + step)
        else:
            while i < n_in:
                p = i // C_U
                xx = border_index(left + int(p), width, mode)
                if xx < 0:
                    in8[i] = cval
                else:
                    in8[i] = src[row + uint64(xx * C) + uint64(i - p * C_U)]
                i = uint32(i + step)
        cuda.syncthreads()

        # Slide: thread (r, c) owns outputs r * run .. r * run + run - 1 of channel c.
        stage = uint32((n_in + 3) // 4 * 2)  # staged sums, in 16-bit units, word aligned
        r = tid // C_U
        xs = uint32(r * uint32(run))
        if xs < uint32(out_w):
            first = uint32(xs * C_U + (tid - r * C_U))  # leaves the window next
            enter = uint32(first + uint32(kw * C))  # enters the window next
            acc = uint32(0)
            p = first
            while p < enter:
                acc = uint32(acc + in8[p])
                p = uint32(p + C_U)
            dst = uint32(stage + first)
            st16[dst] = acc
            last = uint32(dst + min(uint32(run), uint32(out_w) - xs) * C_U)
            dst = uint32(dst + C_U)
            while dst < last:
                acc = uint32(acc + in8[enter] - in8[first])
                st16[dst] = acc
                enter = uint32(enter + C_U)
                first = uint32(first + C_U)
                dst = uint32(dst + C_U)
        cuda.syncthreads()

        # Store: whole 32-bit words (x0 * C is even; an odd last lane pairs with the
        # row's padding lane).
        n_words = uint32((out_w * C + 1) // 2)
        base32 = (uint64(y) * uint64(pitch16) + uint64(x0 * C)) // uint64(2)
        w0 = stage // uint32(2)
        i = tid
        while i < n_words:
            sums32[base32 + uint64(i)] = st32[w0 + i]
            i = uint32(i + step)

    return box_row_sums16


@cuda.jit(device=True)
def _pair(sums32, row, words, q, row_cval):
    """The two 16-bit lanes of word q of scratch row `row` (mapped; -1: constant border)."""
    if row < 0:
        return row_cval, row_cval
    w = sums32[uint64(row) * uint64(words) + uint64(q)]
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


@cuda.jit(cache=True)
def box_column_means(sums32, height, lanes, words, kh, ay, mode, row_cval, area, magic,
                     shift_hi, even, strip, out):  # fmt: skip
    """out (the (H, W, C) image flattened, `lanes` = W * C a row) = round(the sum of
    kh rows of sums from row y - ay / area), borders applied; `words` = pitch16 // 2
    32-bit words a scratch row."""
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if q >= words:
        return
    y0 = cuda.blockIdx.y * strip
    y_end = min(y0 + strip, height)
    top = y0 - ay
    lane = uint64(2 * q)
    second = 2 * q + 1 < lanes
    uwords = uint64(words)
    a0 = uint32(0)
    a1 = uint32(0)
    inside = top >= 0 and y_end - 1 - ay + kh <= height
    if inside:
        off = uint64(top) * uwords + uint64(q)
        for _ in range(kh):
            w = sums32[off]
            a0 = uint32(a0 + (w & LOW16))
            a1 = uint32(a1 + (w >> SIXTEEN))
            off += uwords
    else:
        for i in range(kh):
            v0, v1 = _pair(sums32, border_index(top + i, height, mode), words, q, row_cval)
            a0 = uint32(a0 + v0)
            a1 = uint32(a1 + v1)
    o = uint64(y0) * uint64(lanes) + lane
    _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
    y = y0 + 1
    if inside:
        # Four rows at a time, all eight loads issued before the sums use them.
        enter = uint64(top + kh) * uwords + uint64(q)
        leave = uint64(top) * uwords + uint64(q)
        while y + 3 < y_end:
            e0 = sums32[enter]
            e1 = sums32[enter + uwords]
            e2 = sums32[enter + uint64(2) * uwords]
            e3 = sums32[enter + uint64(3) * uwords]
            d0 = sums32[leave]
            d1 = sums32[leave + uwords]
            d2 = sums32[leave + uint64(2) * uwords]
            d3 = sums32[leave + uint64(3) * uwords]
            a0, a1 = _slide(a0, a1, e0 & LOW16, e0 >> SIXTEEN, d0 & LOW16, d0 >> SIXTEEN)
            o += uint64(lanes)
            _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
            a0, a1 = _slide(a0, a1, e1 & LOW16, e1 >> SIXTEEN, d1 & LOW16, d1 >> SIXTEEN)
            o += uint64(lanes)
            _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
            a0, a1 = _slide(a0, a1, e2 & LOW16, e2 >> SIXTEEN, d2 & LOW16, d2 >> SIXTEEN)
            o += uint64(lanes)
            _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
            a0, a1 = _slide(a0, a1, e3 & LOW16, e3 >> SIXTEEN, d3 & LOW16, d3 >> SIXTEEN)
            o += uint64(lanes)
            _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
            enter += uint64(4) * uwords
            leave += uint64(4) * uwords
            y += 4
    while y < y_end:
        e0, e1 = _pair(sums32, border_index(y - ay + kh - 1, height, mode), words, q, row_cval)
        d0, d1 = _pair(sums32, border_index(y - ay - 1, height, mode), words, q, row_cval)
        a0, a1 = _slide(a0, a1, e0, e1, d0, d1)
        o += uint64(lanes)
        _emit(out, o, a0, a1, second, area, magic, shift_hi, even)
        y += 1


_ROW_SUMS: dict = {}


def row_kernel_for(channels: int):
    """The compiled-on-demand row pass for this many channels (kept per process)."""
    if channels not in _ROW_SUMS:
        _ROW_SUMS[channels] = _make_row_sums(channels)
    return _ROW_SUMS[channels]


def box_twopass(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None):
    """Box filter in two passes (see the module docstring); `geometry` from
    `kernels.box_plan.twopass_plan`. Raises ValueError when the plan says the case is
    not handled. The scratch of row sums is reused across calls (`kernels.launch.scratch`).
    """
    height, width, channels = img.shape
    kh, kw = ksize
    ay, ax = anchor
    geo = geometry or twopass_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_twopass handles uint8 images with boxes up to 257 columns")
    if out is None:
        out = cuda.device_array(img.shape, dtype=img.dtype)
    n = height * width * channels
    pitch16 = geo["pitch16"]
    sums32 = scratch((height * pitch16 // 2,), np.uint32)
    row_pass = row_kernel_for(channels)
    row_pass[geo["row_grid"], geo["row_threads"], 0, geo["row_smem"]](
        img.reshape(n), width, kw, ax, mode, np.int64(cval), geo["run"], geo["seg_w"],
        pitch16, sums32,
    )  # fmt: skip
    area = kh * kw
    magic, shift_hi = packed_magic(area, 511 * area + 1)
    box_column_means[geo["col_grid"], geo["col_threads"]](
        sums32, height, width * channels, pitch16 // 2, kh, ay, mode,
        np.uint32(kw * int(cval)), np.uint32(area), np.uint32(magic), np.uint32(shift_hi),
        geo["even"], geo["strip"], out.reshape(n),
    )  # fmt: skip
    return out
