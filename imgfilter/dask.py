"""Dask arrays: `blur`, `filter2d` and `contour` over chunked images.

    import dask.array as da
    import imgfilter.dask as ifd
    x = da.from_array(img, chunks=(2048, -1, -1))   # (H, W) or (H, W, C)
    y = ifd.blur(x, 21)                              # a dask array, lazy
    y.compute()                                      # == imgfilter.blur(img, 21)

Each function takes a dask array whose chunks are NumPy or CuPy arrays and returns
a dask array of the input's shape, dtype, chunks and chunk type (contour: (H, W)).
Options are the array API's (anchor, border, border_value, backend, method; see
`imgfilter.api`), checked when the graph is built: a bad option raises the API's
`UsageError` at once, not at compute time. `out` and `stream` are not taken: each
chunk gets its own result, on the stream of its own array.

How: the image is filtered in full-width row bands, each band with `depth` rows of
its neighbours (as `dask.array.map_overlap` with boundary "none" would, but without
copying the band: the band filtered alone, then the rows next to each neighbour
redone with the neighbour's: `_map_bands`),
depth = max(rows above, rows below the anchor). Column chunks are
merged for the filter (the result is split back into the input's chunks): a column's
arithmetic on the CPU backend depends on the row length (OpenCV's SIMD body rounds
with fused multiply-adds, its scalar tail without), while a row's does not, so bands
of whole rows give the whole-image result bit for bit. Row chunks shorter than the
depth are merged with their neighbours (kernels larger than a chunk).

Borders are the image's, not the chunks': a band's imgfilter call applies the border
at its top and bottom, which are the image's own edges for the first and last band
and are trimmed away elsewhere; the whole row is present, so left and right borders
are exact. `wrap` needs the far side of the image: the rows it reaches are
concatenated above and below the image first (`_wrap_rows`) and cut off after.
So every border mode equals the whole-image result of `imgfilter.blur/filter2d/
contour` with the same options: bit-identical on the CPU backend (the tests check it),
and on CUDA wherever its kernels compute each pixel the same way at any position
(integer sums: blur and contour of integer images; see docs/scale.md).

Importing this module needs Dask (`pip install "imgfilter[dask]"`); `import imgfilter`
never imports it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

try:
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
except ImportError:
    raise ImportError('imgfilter.dask needs Dask: pip install "imgfilter[dask]"') from None

from . import api
from .backends import BACKENDS
from .border import border_code
from .errors import UsageError

WRAP = border_code("wrap")

__all__ = ["blur", "filter2d", "contour"]


def filter2d(
    img: da.Array,
    kernel: Any,
    *,
    anchor: tuple[int, int] | None = None,
    border: str = "reflect101",
    border_value: float = 0.0,
    backend: str = "auto",
    method: str = "auto",
) -> da.Array:
    """`imgfilter.filter2d` of a dask array: correlate with `kernel` (up to 255x255).

    The graph is built at once and nothing is computed: each full-width row band is
    filtered by one `imgfilter.filter2d` call with its neighbours' rows, and the
    borders are the image's, not the chunks' (see the module docstring). The result
    equals `imgfilter.filter2d` of the whole image: bit-identical on the CPU backend.

    Args:
        img: A dask array (H, W) or (H, W, C), C in {1, 3, 4}, uint8/uint16/float32,
            NumPy or CuPy chunks (any chunking; chunk sizes must be known).
        kernel: As `imgfilter.filter2d`.
        anchor: As `imgfilter.filter2d`.
        border: As `imgfilter.filter2d`; every mode, wrap included, gives the
            whole-image result.
        border_value: As `imgfilter.filter2d`.
        backend: As `imgfilter.filter2d` (CuPy chunks need "cuda" or "auto").
        method: As `imgfilter.filter2d`.

    Returns:
        A lazy dask array of img's shape, dtype and chunks, with img's chunk type.

    Raises:
        UsageError: When the graph is built, not at compute time: not a dask array,
            unknown chunk sizes, an image or option `imgfilter.filter2d` refuses, an
            unknown backend, or device chunks with backend "cpu".

    Example:
        >>> import dask.array as da
        >>> import numpy as np
        >>> import imgfilter.dask as ifd
        >>> x = da.from_array(np.zeros((4096, 512, 3), np.uint8), chunks=(1024, -1, -1))
        >>> y = ifd.filter2d(x, np.ones((5, 5)) / 25)   # lazy
        >>> y.compute().shape
        (4096, 512, 3)
    """
    x = _check_image(img, backend)
    k = api.as_kernel(kernel)
    (ay, _), code, _, _ = api._options(anchor, k.shape, border, border_value, method, x.dtype)
    opts = dict(anchor=anchor, border=border, border_value=border_value, backend=backend,
                method=method)  # fmt: skip
    band = functools.partial(_filter_band, _api_filter2d, (k,), opts, True)
    return _in_bands(x, band, (ay, k.shape[0] - 1 - ay), code, keep_channels=True)


def blur(
    img: da.Array,
    k: int | tuple[int, int],
    *,
    anchor: tuple[int, int] | None = None,
    border: str = "reflect101",
    border_value: float = 0.0,
    backend: str = "auto",
    method: str = "auto",
) -> da.Array:
    """`imgfilter.blur` of a dask array: the normalized k x k box (or OpenCV's
    (width, height)).

    Image, return and borders as `filter2d` (this module's): the result equals
    `imgfilter.blur` of the whole image.

    Args:
        img: A dask array (H, W) or (H, W, C), as `filter2d`.
        k: As `imgfilter.blur`: a side, or OpenCV's (width, height).
        anchor: As `imgfilter.blur`.
        border: As `imgfilter.blur`.
        border_value: As `imgfilter.blur`.
        backend: As `imgfilter.blur`.
        method: As `imgfilter.blur`.

    Returns:
        A lazy dask array of img's shape, dtype and chunks.

    Raises:
        UsageError: When the graph is built, for anything `filter2d` (this module's) or
            `imgfilter.blur` refuses.

    Example:
        >>> import dask.array as da
        >>> import numpy as np
        >>> import imgfilter.dask as ifd
        >>> x = da.from_array(np.zeros((8192, 1024), np.uint16), chunks=(2048, 512))
        >>> ifd.blur(x, 21).chunks == x.chunks
        True
    """
    x = _check_image(img, backend)
    (kh, _), (ay, _), code, _, _ = api._box_options(k, anchor, border, border_value, method,
                                                    x.dtype)  # fmt: skip
    opts = dict(anchor=anchor, border=border, border_value=border_value, backend=backend,
                method=method)  # fmt: skip
    band = functools.partial(_filter_band, _api_blur, (k,), opts, True)
    return _in_bands(x, band, (ay, kh - 1 - ay), code, keep_channels=True)


def contour(
    img: da.Array,
    *,
    border: str = "reflect101",
    border_value: float = 0.0,
    backend: str = "auto",
    method: str = "auto",
) -> da.Array:
    """`imgfilter.contour` of a dask array: the OR-merged four-direction edge map.

    Args:
        img: A dask array (H, W) or (H, W, C) uint8/uint16 (colour becomes gray as
            cv2.cvtColor), NumPy or CuPy chunks.
        border: As `imgfilter.contour`.
        border_value: As `imgfilter.contour`.
        backend: As `imgfilter.contour`.
        method: As `imgfilter.contour`.

    Returns:
        A lazy dask array (H, W) of img's dtype, in img's row and column chunks.

    Raises:
        UsageError: When the graph is built: a float32 image, or anything `filter2d`
            (this module's) refuses.

    Example:
        >>> import dask.array as da
        >>> import numpy as np
        >>> import imgfilter.dask as ifd
        >>> x = da.from_array(np.zeros((2048, 2048, 3), np.uint8), chunks=(512, 512, 3))
        >>> ifd.contour(x).chunks
        ((512, 512, 512, 512), (512, 512, 512, 512))
    """
    x = _check_image(img, backend)
    if x.dtype == np.float32:
        raise UsageError("contour needs an integer image (uint8 or uint16), got float32")
    code = border_code(border)
    api._check_method(method, "contour")
    api._cast_value(border_value, x.dtype)
    opts = dict(border=border, border_value=border_value, backend=backend, method=method)
    band = functools.partial(_filter_band, _api_contour, (), opts, False)
    return _in_bands(x, band, (1, 1), code, keep_channels=False)


# ------------------------------------------------------------------ checks


def _check_image(img: Any, backend: str) -> da.Array:
    """img as checked by the array API (rank, channels, size, dtype), from its shape
    and dtype alone; UsageError otherwise. Also checks the backend's name."""
    if not isinstance(img, da.Array):
        raise UsageError(
            f"imgfilter.dask takes a dask array, got {type(img).__name__}; "
            "for NumPy or device arrays use imgfilter.blur/filter2d/contour"
        )
    if any(np.isnan(n) for n in img.shape):
        raise UsageError("the dask array's chunk sizes are unknown; call compute_chunk_sizes()")
    if not api._plain_image(img.shape, np.dtype(img.dtype)):
        # The API's own checks and messages, on a view of the shape that holds no data.
        api._as_image(np.broadcast_to(np.zeros((), img.dtype), img.shape))
    name = str(backend).lower()
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if name == "cpu" and not isinstance(img._meta, np.ndarray):
        raise UsageError("device arrays need the cuda backend (or copy them to the host)")
    return img


# ------------------------------------------------------------------ one band


def _api_filter2d(band, kernel, **opts):
    return api.filter2d(band, kernel, **opts)


def _api_blur(band, k, **opts):
    return api.blur(band, k, **opts)


def _api_contour(band, **opts):
    return api.contour(band, **opts)


def _filter_band(call, args: tuple, opts: dict, keep_channels: bool, band: Any) -> Any:
    """call(band, *args, **opts) on one row band (with its neighbours' rows), the
    result as the band's own array type: a CuPy band's result is allocated by CuPy
    (its memory pool, not a fresh device allocation per band) and written as `out`."""
    if isinstance(band, np.ndarray):
        return call(band, *args, **opts)
    xp = _namespace(band)
    band = xp.ascontiguousarray(band)
    out = xp.empty(band.shape if keep_channels else band.shape[:2], band.dtype)
    call(band, *args, out=out, **opts)
    return out


def _namespace(chunk: Any):
    """The array module of a chunk (cupy for a cupy.ndarray)."""
    import importlib

    return importlib.import_module(type(chunk).__module__.split(".")[0])


# ------------------------------------------------------------------ bands


def _in_bands(x: da.Array, band, reach: tuple[int, int], code: int, keep_channels: bool):
    """band() over full-width row bands of x, each with `depth` rows of its neighbours,
    depth = max(reach) (rows above, below the anchor); returns the result in x's chunks
    ((H, W) chunks without the channel axis when not keep_channels).

    For wrap the rows reach wraps to are concatenated first (their band calls still
    use wrap, which then matters only for the columns) and cut off after."""
    top, bottom = reach
    depth = max(top, bottom)
    chunks = x.chunks if keep_channels else x.chunks[:2]
    whole = {axis: -1 for axis in range(1, x.ndim)}  # full rows, all channels
    padded = code == WRAP and depth > 0
    y = _wrap_rows(x, top, bottom) if padded else x
    rows = list(x.chunks[0])
    if padded:
        rows[0] += top
        rows[-1] += bottom
    rows = _at_least(rows, depth)
    y = y.rechunk({0: rows, **whole})
    out = _map_bands(y, band, depth if len(rows) > 1 else 0, keep_channels)
    if padded:
        out = out[top : top + x.shape[0]]
    return out.rechunk(chunks)


def _map_bands(y: da.Array, band, depth: int, keep_channels: bool) -> da.Array:
    """band() on each row chunk of y together with `depth` rows of each neighbour (none
    past the image's top and bottom), the neighbours' rows cut from its result.

    y has one chunk across its columns and channels. The graph is written out: per
    band, one task slicing its first and last `depth` rows (`_ends`, run where the band
    lies, so only those rows travel to its neighbours), one filtering the band as it is
    (`_filter_alone`), and one redoing its `depth` rows next to each neighbour with the
    neighbour's rows (`_with_seams`): 3n tasks for n bands. A band's filter so never
    waits for rows from another worker; only the seams do (on a GPU, copying a CuPy
    band's rows off its device waits for the work queued there before it). A band
    shorter than 2 * depth rows is one task, joined with its neighbours' rows
    (`_filter_joined`). dask's map_overlap joins each band with its neighbours' rows in
    a task of its own (one thread copying the whole band: of a 200 MB band, 70 ms,
    twice the band's GPU filter with its copies), and built from array operations the
    halos take twice the tasks (slice, concatenate, rechunk): each a scheduler round
    trip per run."""
    drop = y.ndim == 3 and not keep_channels
    rest = (0,) * (y.ndim - 1)
    n = len(y.chunks[0])
    token = tokenize(y, band, depth, keep_channels)
    name, ends = f"imgfilter-band-{token}", f"imgfilter-ends-{token}"
    alone = f"imgfilter-alone-{token}"
    graph: dict = {}
    if depth and n > 1:
        for i in range(n):
            graph[(ends, i)] = (_ends, (y.name, i, *rest), depth)
    for i in range(n):
        above = (ends, i - 1) if depth and i > 0 else None
        below = (ends, i + 1) if depth and i < n - 1 else None
        own = (y.name, i, *rest)
        key = (name, i, *rest[: 1 if drop else None])
        if (above or below) and y.chunks[0][i] >= 2 * depth:
            graph[(alone, i)] = (_filter_alone, band, own)
            graph[key] = (_with_seams, band, (alone, i), own, above, below)
        else:
            graph[key] = (_filter_joined, band, own, above, below)
    chunks = y.chunks[:2] if drop else y.chunks
    meta = y._meta.reshape((0, 0)) if drop else y._meta
    layers = HighLevelGraph.from_collections(name, graph, dependencies=[y])
    return da.Array(layers, name, chunks, meta=meta)


def _ends(own: Any, depth: int) -> tuple[Any, Any]:
    """The band's first and last `depth` rows (views): the rows its neighbours below
    and above need."""
    return own[:depth], own[own.shape[0] - depth :]


def _filter_alone(band, own: Any) -> Any:
    """band() of `own` without its neighbours' rows: exact except in its `depth` rows
    next to each neighbour, which `_with_seams` redoes."""
    return band(own)


def _with_seams(band, result: Any, own: Any, above: Any, below: Any) -> Any:
    """`result` (band() of `own` alone, `_filter_alone`) with its `depth` rows next to
    each neighbour redone from band() of a strip of 3 * depth rows (the last `depth`
    rows of the band above, `_ends` of it or None where there is none, or the first of
    the band below, and 2 * depth of own's), where the strip's own border rule never
    reaches them. Writes into `result`, which no other task reads, and returns it;
    `own` has at least 2 * depth rows."""
    if above is not None:
        above = above[1]
        depth = above.shape[0]
        result[:depth] = band(_joined([above, own[: 2 * depth]]))[depth : 2 * depth]
    if below is not None:
        below = below[0]
        depth, n = below.shape[0], own.shape[0]
        result[n - depth :] = band(_joined([own[n - 2 * depth :], below]))[depth : 2 * depth]
    return result


def _filter_joined(band, own: Any, above: Any, below: Any) -> Any:
    """band() of `own` joined with the last rows of the band above it and the first of
    the one below (`_ends` of each, None: no neighbour there, both None: `own` alone),
    the result's rows of `own` only."""
    upper = None if above is None else above[1]
    lower = None if below is None else below[0]
    parts = [part for part in (upper, own, lower) if part is not None]
    if len(parts) == 1:
        return band(own)
    top = 0 if upper is None else upper.shape[0]
    return band(_joined(parts))[top : top + own.shape[0]]


def _joined(parts: list) -> Any:
    """The parts stacked by rows: host bands of `BANDS_MIN_BYTES` or more by
    `imgfilter.streamed.join_rows` (several threads, huge pages)."""
    own = parts[0]
    if isinstance(own, np.ndarray) and sum(p.nbytes for p in parts) >= api.BANDS_MIN_BYTES:
        from .streamed import join_rows

        return join_rows(parts)
    return _namespace(own).concatenate(parts, axis=0)


def _at_least(chunks, depth: int) -> tuple[int, ...]:
    """Chunk sizes with the same total, each >= depth and > 0 (neighbours merged),
    unless the total is smaller: then one chunk."""
    least = max(depth, 1)
    out: list[int] = []
    for n in chunks:
        if out and out[-1] < least:
            out[-1] += n
        else:
            out.append(n)
    if len(out) > 1 and out[-1] < least:
        out[-2] += out.pop()
    return tuple(out)


def _wrap_rows(x: da.Array, top: int, bottom: int) -> da.Array:
    """x with rows -top .. H + bottom - 1 taken modulo H (np.pad(mode="wrap") on
    axis 0, for any top and bottom, also larger than H)."""
    h = x.shape[0]
    pieces = []
    p, end = -top, h + bottom
    while p < end:
        start = p % h
        stop = min(h, start + end - p)
        pieces.append(x[start:stop])
        p += stop - start
    return da.concatenate(pieces, axis=0)
