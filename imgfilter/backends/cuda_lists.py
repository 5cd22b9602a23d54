"""The CUDA backend's lists of device images of any sizes: `correlate_list`,
`box_list`, `contour_list`. Each image's launch function runs once under a
`kernels.common.var_shape.Collecting`; images of equal plans share each launch
(`var_shape_plan`), so the launches do not grow with the number of images; later
calls of the same shapes replay a `VarShapeRecipe`. Images taller than one grid go
alone in row bands (`cuda._in_row_bands`). The var-shape kernels, generated source
that Numba's cache cannot keep, go to the kernel cache (`kernels.common.binaries`) once
compiled, so that a later process loads them instead of compiling them again.
"""

from __future__ import annotations

import gc

import numpy as np

from kernels.box import dispatch as _box
from kernels.common import replay
from kernels.common.arrays import empty_many, resolve_stream
from kernels.common.cudadrv import CudaError, GpuOutOfMemory
from kernels.common.launch import compile_lock
from kernels.common.var_shape import Collecting, VarShapeRecipe, run_var_shape, var_shape_plan
from kernels.contour import launch as _contour

from ..errors import DeviceError, GpuMemoryError, UsageError
from . import background
from . import cuda as _cuda
from .cuda import (
    _blocked_or_window,
    _correlate_launches,
    _prepared,
)


def _on_device_list(imgs: list, values: list, outs, stream, out_shapes: list, plan_for,
                    rows: tuple, border: int, band_rows=None) -> list:  # fmt: skip
    """Device images of any sizes (a list of (H, W, C) arrays) filtered in a number of
    launches that does not grow with their number (`kernels.common.var_shape.var_shape_plan`):
    each image's launch function runs once under a `Collecting`, images of equal plans
    share each launch, blocks past an image's own grid return at once. Queued on the
    first image's stream (or `stream`); returns `outs` (allocated as views of one pool
    allocation when None). `plan_for(img, value)` (values[i]: image i's border value,
    cast to its dtype) gives (key, record): the options that shape the image's
    launches and `record(src, dst, handle)`. Later calls with the same shapes,
    dtypes, keys, alignments and stream replay a `kernels.common.var_shape.VarShapeRecipe`.
    Images taller than one grid, or than `band_rows(img)` rows where given, go alone
    (`_in_row_bands`)."""
    handle = resolve_stream(stream, imgs[0])
    try:
        if outs is None:
            outs = empty_many(out_shapes, [img.dtype for img in imgs], handle)
        plans = [plan_for(img, value) for img, value in zip(imgs, values, strict=True)]
        short = []
        for img, out, (key, record) in zip(imgs, outs, plans, strict=True):
            most = band_rows(img) if band_rows is not None else _cuda.MAX_GRID_ROWS
            if img.shape[0] > most:
                _cuda._in_row_bands(key, img, out, handle, record, rows, border, most)
            else:
                short.append((img, out, key, record))
        if not short:
            return outs
        if _cuda.SIMULATOR:
            with compile_lock:
                _collect_and_run(short, handle)
            return outs
        key = ("lists", tuple([(img.shape, img.dtype.num, img.ptr & 15, out.ptr & 15, k)
                               for img, out, k, _ in short]), handle)  # fmt: skip
        recipe = replay.TABLE.get(key)
        if recipe is None:
            recipe = _collect_and_run(short, handle)
            if recipe is not None:
                replay.keep(key, recipe)
        else:
            recipe.replay([p for img, out, _, _ in short for p in (img.ptr, out.ptr)], handle)
        return outs
    except GpuOutOfMemory as exc:  # pragma: no cover - real GPU only
        raise GpuMemoryError(f"{exc}; try --backend cpu") from exc
    except CudaError as exc:  # pragma: no cover - real GPU only
        raise DeviceError(f"CUDA error: {exc}") from exc


def _collect_and_run(items: list, handle: int):
    """Run each (img, out, key, record)'s launch function under a `Collecting`, queue
    the merged plan on `handle`, and return its `VarShapeRecipe` (None on the
    simulator, or when the launches cannot be replayed: weights uploaded meanwhile).
    Python's cyclic collector waits meanwhile: this makes some hundred objects an
    image, none of them in a cycle, and its full passes over them took 40% of the
    time (5000 images)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        collected, images, replayable = [], [], True
        for img, out, _, record in items:
            with Collecting() as collecting:
                record(img, out, handle)
            collected.append(collecting.steps)
            images.append((img, out, collecting.buffers))
            replayable = replayable and collecting.replayable
        plan = var_shape_plan(collected)
        run_var_shape(plan, handle)
        if _cuda.SIMULATOR or not replayable:
            return None
        with compile_lock:
            return VarShapeRecipe.build(plan, images)
    finally:
        if enabled:
            gc.enable()


def _memo_by_image(make):
    """plan_for(img, value) for `_on_device_list`: make(dtype, value) once per dtype
    and border value."""
    found: dict = {}

    def plan_for(img, value):
        key = (img.dtype, value)
        plan = found.get(key)
        if plan is None:
            plan = found[key] = make(img.dtype, value)
        return plan

    return plan_for


def correlate_list(imgs: list, kernel, anchor, border, values: list, method, outs=None,
                   stream=None) -> list:  # fmt: skip
    """`correlate` of each device image of a list (any sizes; values[i] the border
    value cast to image i's dtype), in launches that do not grow with the number of
    images (`_on_device_list`)."""
    kernel = np.ascontiguousarray(kernel, dtype=np.float32)
    data = kernel.tobytes()
    requested = method
    resolved, terms = _prepared(kernel.shape, data, method)

    def make(dtype, value):
        method = resolved
        if requested == "auto" and method == "blocked" and background.ENABLED:
            if not _cuda.SIMULATOR:
                method = _blocked_or_window(*kernel.shape, dtype)

        def record(src, dst, handle):
            _correlate_launches(src, dst, handle, kernel, terms, anchor, border, value, method)

        return ("correlate", method, kernel.shape, data, anchor, border, value), record

    rows = (anchor[0], kernel.shape[0] - 1 - anchor[0])
    shapes = [i.shape for i in imgs]
    return _on_device_list(imgs, values, outs, stream, shapes, _memo_by_image(make), rows, border)


def box_list(imgs: list, ksize, anchor, border, values: list, method, outs=None,
             stream=None) -> list:  # fmt: skip
    """`box` of each device image of a list (see `correlate_list`); a case the box
    kernel `method` names does not take is a UsageError."""
    try:
        return _box_list(imgs, ksize, anchor, border, values, method, outs, stream)
    except _box.MethodRefused as exc:
        raise UsageError(str(exc)) from None


def _box_list(imgs: list, ksize, anchor, border, values: list, method, outs=None,
             stream=None) -> list:  # fmt: skip
    """`box` of each device image of a list (see `correlate_list`)."""
    kh, kw = ksize
    run = _box.box_by_name(method)

    def make(dtype, value):
        def record(src, dst, handle):
            run(src, ksize, anchor, border, value, dst, handle)

        return ("box", method, ksize, anchor, border, value), record

    rows = (anchor[0], kh - 1 - anchor[0])
    shapes = [i.shape for i in imgs]

    def band_rows(img) -> int:
        return (
            _cuda._box_band_rows(img.shape, img.dtype, ksize, rows)
            if method == "auto"
            else _cuda.MAX_GRID_ROWS
        )

    return _on_device_list(imgs, values, outs, stream, shapes, _memo_by_image(make), rows, border,
                           band_rows)  # fmt: skip


def contour_list(imgs: list, border, values: list, method, outs=None, stream=None) -> list:
    """`contour` of each device image of a list (see `correlate_list`); results (H, W)."""

    def make(dtype, value):
        def record(src, dst, handle):
            _contour.contour(src, border, int(value), dst, handle)

        return ("contour", border, value), record

    shapes = [i.shape[:-1] for i in imgs]
    return _on_device_list(imgs, values, outs, stream, shapes, _memo_by_image(make), (1, 1),
                           border)  # fmt: skip
