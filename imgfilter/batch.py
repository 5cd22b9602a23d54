"""The batch forms of the array API: `filter2d_batch`, `blur_batch`, `contour_batch`.

A batch is a 4-D (N, H, W, C) or 3-D (N, H, W) array, host or device, or a list of
images of any sizes. A device batch runs each kernel once for all its images; a list
of device images in launches that do not grow with its length. Host images go where
`imgfilter.placement` puts them (under backend auto, cheap filters of images up to its
size limit on the CPU): those on the CPU to the CPU backend at once, spread over the
CPUs, the others image by image through the single-image functions of
`imgfilter.api`. Each image has its own borders: each result equals filtering that
image alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.common.arrays import as_device_array, is_device_array
from kernels.common.devarray import DeviceArray

from . import placement
from .api import (
    _as_3d,
    _as_image,
    _c_contiguous,
    _cast_value,
    _check_method,
    _check_out,
    _check_stream,
    _options,
    _plain_image,
    _shaped,
    as_kernel,
    blur,
    box_size,
    contour,
    filter2d,
)
from .backends import get_backend
from .border import border_code
from .errors import UsageError


def _lists():
    """The CUDA backend's lists of device images (imported, with Numba, on first use)."""
    from .backends import cuda_lists

    return cuda_lists


def _batch(images: Any, out: Any, stream: Any, backend: str, one, many, many_list, result_shape,
           rule: tuple) -> Any:  # fmt: skip
    """Filter each image of a batch.

    images: a 4-D (N, H, W, C) or 3-D (N, H, W) array (host or device), the first axis
    always the batch, or a list/tuple of images of any sizes. Returns the same kind:
    an array of the results (into `out`, an array of that shape, when given) or a list
    (into `out`, a list of arrays, when given). A device array goes to the backend at
    once through `many(backend, batch (N, H, W, C), out, stream)` (its launches queued
    back to back on one stream); a list of device images through `many_list(lists,
    images (H, W, C), outs, stream)` (`_device_list`; `lists`: the backend's list
    functions, `box_list`, `correlate_list`, `contour_list`); host arrays and lists, and
    lists mixing host and device images, through `_host` (`rule`: the operation, method
    and kernel taps `imgfilter.placement` places them by). Each image has its own
    borders: results equal filtering each alone.
    """
    if isinstance(images, list | tuple):
        if out is not None and (not isinstance(out, list | tuple) or len(out) != len(images)):
            raise UsageError("out must be a list of as many arrays as there are images")
        if images and all(_is_device_input(img) for img in images):
            return _device_list(images, out, stream, backend, many_list, result_shape)
        outs = out if out is not None else [None] * len(images)
        return _host(list(images), list(outs), stream, backend, one, many_list, result_shape,
                     rule)  # fmt: skip
    device = not isinstance(images, np.ndarray) and is_device_array(images)
    batch = as_device_array(images) if device else np.asarray(images)
    if batch.ndim not in (3, 4):
        raise UsageError(
            f"a batch array must be 3-D (N, H, W) or 4-D (N, H, W, C), got shape {batch.shape}"
        )
    if batch.shape[0] < 1:
        raise UsageError("the batch is empty")
    _as_image(batch[0])  # dtype, channels, size (and contiguity on the device)
    shape = (batch.shape[0], *result_shape(batch.shape[1:]))
    if not device:
        host_out = np.empty(shape, batch.dtype) if out is None else out
        dout = _check_out(host_out, batch, False, shape)
        _host(list(batch), list(dout), stream, backend, one, many_list, result_shape, rule)
        return host_out
    if not _c_contiguous(batch.shape, batch.strides, batch.dtype.itemsize):
        raise UsageError("device batches must be C-contiguous")
    stream = _check_stream(stream)
    be = get_backend(backend, device_input=True)
    dout = None if out is None else _check_out(out, batch, True, shape)
    batch4 = batch if batch.ndim == 4 else batch.reshape(*batch.shape, 1)
    result = many(be, batch4, dout, stream)
    return out if out is not None else result.reshape(shape)


def _host(images: list, outs: list, stream: Any, backend: str, one, many_list, result_shape,
          rule: tuple) -> list:  # fmt: skip
    """The results of host images (or of a list mixing host and device ones). The NumPy
    images that `imgfilter.placement` gives the CPU backend (`rule`: (operation, method,
    kernel taps); under backend auto, cheap filters of images up to its size limit) are
    checked as the single-image function checks them and go to the CPU backend at once,
    `many_list(cpu backend, images (H, W, C), outs, None)`, which spreads them over the
    CPUs in chunks of images (`backends.cpu.each_image`; one Python call per image,
    OpenCV's where it computes our result); the others go one by one through
    one(img, out, stream, backend)."""
    op, method, taps = rule
    limits: dict = {}  # dtype -> placement.cpu_bytes
    here, arrs, results = [], [], [None] * len(images)
    for i, img in enumerate(images):
        if isinstance(img, np.ndarray):
            limit = limits.get(img.dtype)
            if limit is None:
                limit = limits[img.dtype] = placement.cpu_bytes(op, img.dtype, backend, method,
                                                                taps)  # fmt: skip
            if limit and img.nbytes <= limit:
                here.append(i)
                plain = img.flags.c_contiguous and _plain_image(img.shape, img.dtype)
                arrs.append(img if plain else _as_image(img)[0])
                continue
        results[i] = one(img, outs[i], stream, backend)
    if not here:
        return results
    given = [outs[i] for i in here]
    douts = None
    if any(o is not None for o in given):
        checked = zip(given, arrs, strict=True)
        douts = [_check_out(o, a, False, result_shape(a.shape)) for o, a in checked]
    done = many_list(get_backend("cpu"), [_as_3d(a) for a in arrs], douts, None)
    for i, a, res, o in zip(here, arrs, done, given, strict=True):
        # results come (H, W, C), or (H, W) where the result is one plane (contour)
        results[i] = o if o is not None else (
            res if res.ndim in (2, a.ndim) else res.reshape(result_shape(a.shape)))  # fmt: skip
    return results


def _is_device_input(img: Any) -> bool:
    return type(img) is DeviceArray or (not isinstance(img, np.ndarray) and is_device_array(img))


def _device_list(images: list, out: Any, stream: Any, backend: str, many_list,
                 result_shape) -> list:  # fmt: skip
    """A list of device images of any sizes, dtypes and channel counts, each checked as
    `filter2d` checks one, given to the CUDA backend at once: `many_list(its lists,
    images as (H, W, C), outs (None or the checked arrays), stream)` filters them in a
    number of launches that does not grow with their number. Returns the results (each of its
    image's shape, less the channel axis of a 2-D image) or `out` as a list."""
    arrs = [_as_image(img)[0] for img in images]
    shapes = [result_shape(a.shape) for a in arrs]
    outs = None
    if out is not None:
        outs = [_check_out(o, a, True, shape) for o, a, shape in zip(out, arrs, shapes,
                                                                       strict=True)]  # fmt: skip
    stream = _check_stream(stream)
    get_backend(backend, device_input=True)  # a backend that cannot take device images: refused
    results = many_list(_lists(), [_as_3d(a) for a in arrs], outs, stream)
    if out is not None:
        return list(out)
    return [_shaped(r, shape) for r, shape in zip(results, shapes, strict=True)]


def _list_options(imgs: list, anchor, kshape: tuple, border, border_value, method,
                  op: str) -> tuple:  # fmt: skip
    """`_options` for a list of images: (anchor, border code, method, [each image's
    border value cast to its dtype])."""
    by_dtype = {}
    for img in imgs:
        if img.dtype not in by_dtype:
            by_dtype[img.dtype] = _options(anchor, kshape, border, border_value, method,
                                           img.dtype, op)  # fmt: skip
    a, code, m, _ = by_dtype[imgs[0].dtype]
    return a, code, m, [by_dtype[img.dtype][3] for img in imgs]


def _same_shape(shape: tuple) -> tuple:
    return tuple(shape)


def _image_shape(shape: tuple) -> tuple:
    return tuple(shape[:2])


def filter2d_batch(
    images: Any,
    kernel: Any,
    *,
    anchor: tuple[int, int] | None = None,
    border: str = "reflect101",
    border_value: float = 0.0,
    backend: str = "auto",
    method: str = "auto",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """`filter2d` of every image of a batch.

    A device array runs each kernel once for all its images. A list of device images
    of different sizes runs in a number of launches that does not grow with its length
    (images of one dtype and channel count share each launch; other dtypes or channel
    counts make launches of their own; docs/launch.md, "Images of different sizes in
    one launch"); results are views of one allocation unless `out` is given. Host
    arrays and host lists (and the host images of a list mixing host and device ones)
    go where `imgfilter.placement` puts them: with backend and method auto, a kernel
    of up to 15 taps on images up to its size limit to the CPU, all of those at once
    over the CPUs; the others image by image. Each image has its own borders: every
    result equals filtering that image alone.

    Args:
        images: A 4-D (N, H, W, C) or 3-D (N, H, W) array, host or device (the first
            axis is always the batch; a device array must be C-contiguous), or a list or
            tuple of images of any sizes (see README, Batches).
        kernel: As `filter2d`.
        anchor: As `filter2d`.
        border: As `filter2d`.
        border_value: As `filter2d`.
        backend: As `filter2d`.
        method: As `filter2d`.
        out: An array of the result's shape for an array batch, or a list of as many
            arrays as there are images for a list.
        stream: As `filter2d`; a device batch's launches are queued back to back on it.

    Returns:
        The same form as `images`: an array (N, H, W[, C]) of the results, or a list of
        them (each of its image's shape); `out` when given.

    Raises:
        UsageError: A batch array that is not 3-D or 4-D, an empty batch, a device batch
            that is not C-contiguous, an `out` list of the wrong length, or any image or
            option `filter2d` refuses.
        DeviceError: Backend "cuda" without a usable GPU.

    Example:
        >>> import numpy as np
        >>> import imgfilter
        >>> batch = np.zeros((4, 32, 32, 3), np.uint8)
        >>> imgfilter.filter2d_batch(batch, np.ones((3, 3)) / 9).shape
        (4, 32, 32, 3)
        >>> sizes = [np.zeros((20, 30), np.uint8), np.zeros((64, 48), np.uint8)]
        >>> [r.shape for r in imgfilter.filter2d_batch(sizes, [[1, 2, 1]])]
        [(20, 30), (64, 48)]
    """
    k = as_kernel(kernel)
    opts = dict(anchor=anchor, border=border, border_value=border_value, method=method)

    def one(img, out, stream, backend):
        return filter2d(img, k, out=out, stream=stream, backend=backend, **opts)

    def many(be, batch, out, stream):
        a, code, m, value = _options(anchor, k.shape, border, border_value, method, batch.dtype)
        return be.correlate(batch, k, a, code, value, m, _out_4d(out), stream)

    def many_list(lists, imgs, outs, stream):
        a, code, m, values = _list_options(imgs, anchor, k.shape, border, border_value, method,
                                         "filter2d")  # fmt: skip
        return lists.correlate_list(imgs, k, a, code, values, m, _outs_3d(outs), stream)

    return _batch(images, out, stream, backend, one, many, many_list, _same_shape,
                  ("filter", method, k.size))  # fmt: skip


def blur_batch(
    images: Any,
    k: int | tuple[int, int],
    *,
    anchor: tuple[int, int] | None = None,
    border: str = "reflect101",
    border_value: float = 0.0,
    backend: str = "auto",
    method: str = "auto",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """`blur` of every image of a batch.

    The batch forms, launches and results are as `filter2d_batch` says; with backend
    and method auto, host images of 8 or 16 bits go to the CPU up to the size limit of
    `imgfilter.placement` (OpenCV's box filter, over the CPUs at once), float32 ones
    image by image to the GPU where there is one.

    Args:
        images: A 4-D (N, H, W, C) or 3-D (N, H, W) array, host or device, or a list of
            images of any sizes, as `filter2d_batch`.
        k: As `blur`: a side, or OpenCV's (width, height).
        anchor: As `blur`.
        border: As `blur`.
        border_value: As `blur`.
        backend: As `blur`.
        method: As `blur`.
        out: An array of the result's shape, or a list of arrays, as `filter2d_batch`.
        stream: As `filter2d`.

    Returns:
        The same form as `images` (an array or a list of the blurred images); `out` when
        given.

    Raises:
        UsageError: As `filter2d_batch`, and a kernel size `blur` refuses.
        DeviceError: Backend "cuda" without a usable GPU.

    Example:
        >>> import numpy as np
        >>> import imgfilter
        >>> batch = np.zeros((8, 64, 64), np.uint16)
        >>> imgfilter.blur_batch(batch, 5).shape
        (8, 64, 64)
    """
    kh, kw = box_size(k)
    opts = dict(anchor=anchor, border=border, border_value=border_value, method=method)

    def one(img, out, stream, backend):
        return blur(img, k, out=out, stream=stream, backend=backend, **opts)

    def many(be, batch, out, stream):
        a, code, m, value = _options(anchor, (kh, kw), border, border_value, method, batch.dtype,
                                     "blur")  # fmt: skip
        return be.box(batch, (kh, kw), a, code, value, m, _out_4d(out), stream)

    def many_list(lists, imgs, outs, stream):
        a, code, m, values = _list_options(imgs, anchor, (kh, kw), border, border_value, method,
                                         "blur")  # fmt: skip
        return lists.box_list(imgs, (kh, kw), a, code, values, m, _outs_3d(outs), stream)

    return _batch(images, out, stream, backend, one, many, many_list, _same_shape,
                  ("blur", method, 0))  # fmt: skip


def contour_batch(
    images: Any,
    *,
    border: str = "reflect101",
    border_value: float = 0.0,
    backend: str = "auto",
    method: str = "auto",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """`contour` of every image of a batch.

    The batch forms, launches and results are as `filter2d_batch` says; with backend
    and method auto, host images go to the CPU up to the size limit of
    `imgfilter.placement` (over the CPUs at once).

    Args:
        images: A 4-D (N, H, W, C) or 3-D (N, H, W) array, host or device, or a list of
            images of any sizes, as `filter2d_batch`. Integer images only (uint8,
            uint16).
        border: As `contour`.
        border_value: As `contour`.
        backend: As `contour`.
        method: As `contour`.
        out: An (N, H, W) array, or a list of (H, W) arrays.
        stream: As `filter2d`.

    Returns:
        The results (N, H, W), or a list of (H, W); `out` when given.

    Raises:
        UsageError: A float32 image (also one in a list), or anything `filter2d_batch`
            refuses.
        DeviceError: Backend "cuda" without a usable GPU.

    Example:
        >>> import numpy as np
        >>> import imgfilter
        >>> batch = np.zeros((2, 48, 64, 3), np.uint8)
        >>> imgfilter.contour_batch(batch).shape
        (2, 48, 64)
    """
    opts = dict(border=border, border_value=border_value, method=method)

    def one(img, out, stream, backend):
        return contour(img, out=out, stream=stream, backend=backend, **opts)

    def many(be, batch, out, stream):
        if np.dtype(batch.dtype) == np.float32:
            raise UsageError("contour needs an integer image (uint8 or uint16), got float32")
        value = _cast_value(border_value, batch.dtype)
        m = _check_method(method, "contour")
        return be.contour(batch, border_code(border), value, m, out, stream)

    def many_list(lists, imgs, outs, stream):
        if any(np.dtype(i.dtype) == np.float32 for i in imgs):
            raise UsageError("contour needs an integer image (uint8 or uint16), got float32")
        values = [_cast_value(border_value, i.dtype) for i in imgs]
        code, m = border_code(border), _check_method(method, "contour")
        return lists.contour_list(imgs, code, values, m, outs, stream)

    return _batch(images, out, stream, backend, one, many, many_list, _image_shape,
                  ("contour", method, 0))  # fmt: skip


def _outs_3d(outs: list | None) -> list | None:
    """A list's outs as (H, W, C): (H, W) ones gain a channel axis (None stays None)."""
    return None if outs is None else [None if o is None else _as_3d(o) for o in outs]


def _out_4d(out: Any) -> Any:
    """A batch's out as (N, H, W, C): (N, H, W) gains a channel axis."""
    if out is None or out.ndim == 4:
        return out
    return out.reshape(*out.shape, 1)
