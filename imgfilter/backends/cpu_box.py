"""The CPU backend's float32 box: float64 sums that never subtract, in NumPy.

cv2.blur sums float32 images in double running sums (add the entering pixel, subtract
the leaving one), so a huge, inf or NaN pixel, or its rounding, is carried along the
row to boxes that do not hold it. Here every partial sum holds only pixels of its own
box, so such a pixel reaches only the boxes that hold it:
- column sums (van Herk / Gil-Werman, flat in kh): each band of output rows, from its
  first row y0, cuts the padded rows into blocks of kh; the column sum of the box from
  row y is the suffix sum of its block from y plus, unless y starts a block, the prefix
  sum of the next block up to row y + kh - 1;
- row sums: sums of g consecutive column sums (g about sqrt(kw), `group`), then each
  box as kw // g of them plus its kw % g last column sums: about g + kw / g adds per
  output instead of kw;
- out = float32(sum * (1 / area)).
Every sum adds strictly in order (NumPy's cumsum and in-place adds), so the result
depends only on the band layout (`bands`), not on how the work is spread over threads.

NumPy alone: a process that blurs one float32 image compiles and loads nothing (the
Numba loops this replaces took 14-19 s to compile on a first use, and ~0.5 s to import
and load from Numba's cache in every later process).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .cpu_common import axis_map, run_parallel, threads

_BLOCK_VALUES = 1 << 18  # column-sum values per piece of a band (2 MiB of float64)


def group(kw: int) -> int:
    """The group size g of the row sums for boxes kw pixels wide: about sqrt(kw), 1
    (plain sums) below 8."""
    return 1 if kw < 8 else int(math.isqrt(kw))


def bands(h: int) -> int:
    """Bands of output rows of an image h rows high: twice the worker threads (at most
    h). The blocks of kh rows start at each band's first row."""
    return min(h, 2 * threads())


def box_float(img, ksize, anchor, border, value, out) -> np.ndarray:
    """out (H, W, C) float32 = the box means of the float32 image `img` (H, W, C), with
    the box of ksize = (kh, kw) placed by anchor = (ay, ax) and `border` (a code of
    `kernels.common.border_index`; `value` for the constant border). See the module
    docstring for the order of the sums."""
    h, w, nch = img.shape
    kh, kw = ksize
    ay, ax = anchor
    rows = axis_map(h, ay, kh - 1 - ay, border)
    cols = axis_map(w, ax, kw - 1 - ax, border)
    value = float(np.float32(value))  # the border as a float32 image holds it
    scale = 1.0 / (kh * kw)
    nbands = bands(h)
    size = -(-h // nbands)
    per_piece = max(1, min(_BLOCK_VALUES // (kh * w * nch), -(-size // kh)))  # blocks
    pieces = []  # (first output row, rows): pieces of bands, whole blocks from y0
    for y0 in range(0, h, size):
        y1 = min(h, y0 + size)
        step = per_piece * kh
        pieces += [(y, min(step, y1 - y)) for y in range(y0, y1, step)]
    out2 = out.reshape(h, w * nch)
    scratch: dict[int, _Scratch] = {}

    def piece(i: int) -> None:
        y, n = pieces[i]
        key = threading.get_ident()
        if key not in scratch:
            scratch[key] = _Scratch(per_piece * kh, kh, w, cols.shape[0], nch, kw)
        pad = scratch[key].column_sums(img, rows, y, n, kh, value, ax)
        scratch[key].box_sums(pad, cols, ax, kh * value, kw, scale, out2[y : y + n])

    run_parallel(piece, len(pieces), threads())
    return out


class _Scratch:
    """One thread's buffers for pieces of up to `rows` output rows (allocated once a
    call: fresh large arrays for every piece would cost page faults on every use)."""

    def __init__(self, rows: int, kh: int, w: int, wp: int, nch: int, kw: int):
        self.nch = nch
        self.w = w
        self.blocks = np.empty((rows + kh, wp * nch))  # padded rows of column sums
        self.prefix = np.empty((rows // kh, max(kh - 1, 1), w * nch))
        g = group(kw)
        self.grp = np.empty((rows, w * nch + (kw // g - 1) * g * nch))
        self.acc = np.empty((rows, w * nch))

    def column_sums(self, img, rows, y, n, kh, value, left) -> np.ndarray:
        """(n, Wp * C) float64 whose columns left .. left + W - 1 (pixels) hold the
        column sums of kh padded rows from padded row y + r for r < n, in blocks of kh
        from y: suffix sums of a block (from its last row) plus prefix sums of the next
        (from +0, so never -0, as a running sum from 0 is not). Each step adds whole
        rows of blocks (NumPy's cumsum along a middle axis would run its loop over kh
        values at a time)."""
        nch, w = self.nch, self.w
        nblk = -(-n // kh)
        pad = self.blocks[: (nblk + 1) * kh]
        mid = pad[:, left * nch : (left + w) * nch]
        _load_rows(img, rows[y : y + n + kh - 1], value, mid[: n + kh - 1])
        mid[n + kh - 1 :] = 0.0
        blocks = mid.reshape(nblk + 1, kh, -1)
        sums = blocks[:nblk]
        if kh > 1:
            prefix = self.prefix[:nblk]
            np.add(blocks[1:, : kh - 1], 0.0, out=prefix)
            for i in range(1, kh - 1):
                prefix[:, i] += prefix[:, i - 1]
            for i in range(kh - 2, -1, -1):
                sums[:, i] += sums[:, i + 1]
            sums[:, 1:] += prefix
        return pad[:n]

    def box_sums(self, pad, cols, left, cvalue, kw, scale, out) -> None:
        """out (n, W * C) float32 = float32(scale * the sum of kw padded column sums)
        for each output, from `column_sums`' rows, whose other columns are filled here
        from the column map `cols` (-1: `cvalue`, the sum of kh border values). Sums
        of g = `group`(kw) consecutive column sums, then kw // g of them, then the
        kw % g last column sums, each added in order."""
        nch, w = self.nch, self.w
        n = pad.shape[0]
        wc = w * nch
        wp = cols.shape[0]
        pad3 = pad.reshape(n, wp, nch)
        edge = np.r_[0:left, left + w : wp]
        if edge.size:
            src = cols[edge]
            pad3[:, edge] = pad3[:, left + np.maximum(src, 0)]
            pad3[:, edge[src < 0]] = cvalue
        g = group(kw)
        q = kw // g
        m = wc + (q - 1) * g * nch
        grp = self.grp[:n, :m]
        grp[...] = pad[:, :m]
        for j in range(1, g):
            grp += pad[:, j * nch : j * nch + m]
        acc = self.acc[:n]
        acc[...] = grp[:, :wc]
        for j in range(1, q):
            acc += grp[:, j * g * nch : j * g * nch + wc]
        for j in range(q * g, kw):
            acc += pad[:, j * nch : j * nch + wc]
        np.multiply(acc, scale, out=out, casting="same_kind")  # float64 product, rounded


def _load_rows(img, src_rows, value, dst) -> None:
    """dst (len(src_rows), W * C) float64 = image rows src_rows (-1: rows of `value`),
    a slice of the image where they are consecutive."""
    n = src_rows.shape[0]
    first = int(src_rows[0])
    if first >= 0 and src_rows[-1] == first + n - 1:
        dst[...] = img[first : first + n].reshape(n, -1)
        return
    dst[...] = img[np.maximum(src_rows, 0)].reshape(n, -1)
    dst[src_rows < 0] = value
