"""The launches of the planned box kernels, free of Numba: `box_fused`, `box_packed`,
`box_tiled` and `box_twopass` (with its passes `row_pass` and `column_pass`).

Same contract as every box filter (`kernels.box.dispatch`): (H, W, C) uint8 (and,
for box_fused, uint16) device images, exact sums, means rounded half to even,
borders by `kernels.common.border_index` code. Each takes the geometry of its plan
(`kernels.box.plan`), or plans itself, and raises ValueError for a case the plan
does not take. The kernels live in `kernels.box.fused`, `packed`, `tiled` and
`twopass` (which import Numba); here they are named by `kernels.common.refs.KernelRef`
(one ref per kernel: `fused_kernel`, `packed_kernel`, `tiled_kernel`,
`twopass_row_kernel`, `twopass_column_kernel`), so a shipped or cached binary runs
without importing Numba. `kernel_refs` names the kernels a method's launch uses.
"""

from __future__ import annotations

import functools

import numpy as np

from ..common.arrays import empty, start_address
from ..common.launch import SMEM_LIMIT, launch, scratch
from ..common.refs import KernelRef
from .plan import (
    RUNNING_ROW_TILE,
    packed_args,
    packed_plan,
    plan,
    scalar_args,
    tiled_args,
    tiled_plan,
    twopass_args,
    twopass_plan,
)
from .running import box_cols, box_column_sums, box_rows, row_sums_kernel

FUSED = "kernels.box.fused"
PACKED = "kernels.box.packed"
TILED = "kernels.box.tiled"
TWOPASS = "kernels.box.twopass"
box_column_means = KernelRef(TWOPASS, "box_column_means")

# ------------------------------------------------------------------ the kernels, by name


@functools.cache
def fused_kernel(sum_dtype, channels: int, magic_rounding: bool) -> KernelRef:
    """box_fused's kernel for shared-memory sums of `sum_dtype` (uint16 or int32, as
    `kernels.box.plan.plan` gives it: a NumPy type, dtype or name), `channels`
    channels and multiply-high rounding or not."""
    return _fused_ref(np.dtype(sum_dtype), int(channels), bool(magic_rounding))


@functools.cache
def _fused_ref(sum_dtype: np.dtype, channels: int, magic_rounding: bool) -> KernelRef:
    # np.uint16 and np.dtype("uint16") hash apart: one ref for both.
    return KernelRef(FUSED, "fused_kernel", (sum_dtype, channels, magic_rounding))


@functools.cache
def packed_kernel(channels: int, run: int, threads: int, even: bool) -> KernelRef:
    """box_packed's kernel for `channels` channels, `run` outputs per slide, `threads`
    per block and an even box area or not (`kernels.box.plan.packed_plan`)."""
    args = (int(channels), int(run), int(threads), bool(even))
    return KernelRef(PACKED, "packed_kernel", args)


@functools.cache
def tiled_kernel(channels: int, ksize: tuple, threads: int, run: int, tile_w: int,
                 tile_h: int, groups: int, min_blocks: int = 0) -> KernelRef:  # fmt: skip
    """box_tiled's kernel for `channels` channels, the box `ksize` = (kh, kw) (a
    tuple) and the geometry `kernels.box.plan.tiled_plan` gives (its threads, run,
    tile_w, tile_h, groups and min_blocks)."""
    kh, kw = ksize
    sizes = (threads, run, tile_w, tile_h, groups, min_blocks)
    args = (int(channels), (int(kh), int(kw)), *(int(v) for v in sizes))
    return KernelRef(TILED, "tiled_kernel", args)


@functools.cache
def twopass_row_kernel(channels: int, run: int) -> KernelRef:
    """box_twopass's row pass for `channels` channels and runs of `run` outputs."""
    return KernelRef(TWOPASS, "row_kernel", (int(channels), int(run)))


@functools.cache
def _column_tiles(wx: int) -> KernelRef:
    return KernelRef(TWOPASS, "column_tiles_kernel", (int(wx),))


def twopass_column_kernel(geo: dict) -> KernelRef:
    """box_twopass's column pass for `kernels.box.plan.twopass_plan`'s geometry:
    `box_column_tiles` for its block width where it has column groups, else
    `box_column_means`."""
    if not geo["col_groups"]:
        return box_column_means
    return _column_tiles(geo["col_threads"])


def _tiled_ref(channels: int, ksize: tuple, geo: dict) -> KernelRef:
    k = tuple(ksize)
    return tiled_kernel(channels, k, geo["threads"], geo["run"], geo["tile_w"], geo["tile_h"],
                        geo["groups"], geo.get("min_blocks", 0))  # fmt: skip


def _running_refs(channels: int, ksize: tuple, dtype) -> tuple[KernelRef, ...]:
    """The kernels `kernels.box.running.box_running` launches: its column and row
    passes, or box_separable's where its row tile would not fit shared memory (the
    same tests as box_running's)."""
    kh, kw = ksize
    exact32 = np.dtype(dtype) == np.uint8 and kh * kw * 255 < 2**24
    tile_w = RUNNING_ROW_TILE
    smem = ((tile_w + kw - 1) * channels + tile_w * channels) * (4 if exact32 else 8)
    if smem > SMEM_LIMIT:
        return (box_rows, box_cols)
    return (box_column_sums, row_sums_kernel(bool(exact32)))


def kernel_refs(method: str, channels: int, ksize: tuple, geo: dict | None,
                dtype) -> tuple[KernelRef, ...]:  # fmt: skip
    """The kernels, in launch order, that box filter `method` launches for a (H, W,
    `channels`) image of `dtype` and the box `ksize` = (kh, kw): "tiled", "packed",
    "fused" and "twopass" with the geometry of their plans (`geo`), "running" and
    "separable" (`kernels.box.running`; geo unused). ValueError for another method."""
    if method == "tiled":
        return (_tiled_ref(channels, ksize, geo),)
    if method == "packed":
        return (packed_kernel(channels, geo["run"], geo["threads"], geo["even"]),)
    if method == "fused":
        return (fused_kernel(geo["sum_type"], channels, geo["magic_rounding"]),)
    if method == "twopass":
        return (twopass_row_kernel(channels, geo["run"]), twopass_column_kernel(geo))
    if method == "running":
        return _running_refs(channels, tuple(ksize), dtype)
    if method == "separable":
        return (box_rows, box_cols)
    raise ValueError(f"no box method {method!r}")


# ------------------------------------------------------------- images as 32-bit words


def words(flat):
    """The whole 32-bit words of a flat uint8 device array (its last n % 4 bytes are
    left out), as a uint32 device array over the same memory."""
    n4 = flat.shape[0] // 4
    return flat[: 4 * n4].view(np.uint32)


def flat_images(img, out, kernel_name: str, stream: int = 0):
    """(out, src, dst, n): the output (allocated when None), then the (H, W, C) uint8
    device image and the output as flat byte arrays of n elements, for the kernels that
    read the image as 32-bit words; ValueError unless the image starts on a 4-byte
    boundary."""
    if start_address(img) % 4:
        raise ValueError(
            f"{kernel_name} reads 32-bit words: the image must start on a 4-byte boundary"
        )
    if out is None:
        out = empty(img.shape, img.dtype, stream)
    n = img.shape[0] * img.shape[1] * img.shape[2]
    return out, img.reshape(n), out.reshape(n), n


# ------------------------------------------------------------------------- the launches


def box_fused(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None,
              stream: int = 0):  # fmt: skip
    """Box filter in one pass (`kernels.box.fused`); `geometry` from
    `kernels.box.plan.plan`. Queued on `stream`. Raises ValueError when plan says the
    case is not handled.
    """
    height, width, channels = img.shape
    geo = geometry or plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_fused handles uint8/uint16 images with boxes that fit its tile")
    if out is None:
        out = empty(img.shape, img.dtype, stream)
    kernel = fused_kernel(geo["sum_type"], channels, geo["magic_rounding"])
    n = height * width * channels
    args = (img.reshape(n), *scalar_args(img.shape, ksize, anchor, mode, cval, geo), out.reshape(n))
    launch(kernel, geo["grid"], geo["threads"], args, stream, geo["smem"])
    return out


def box_packed(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None,
               stream: int = 0):  # fmt: skip
    """Box filter of a uint8 (H, W, C) device image, four bytes per load
    (`kernels.box.packed`); `geometry` from `kernels.box.plan.packed_plan`. Queued on
    `stream`. Raises ValueError when the plan says the case is not handled or the
    image does not start on a 4-byte boundary.
    """
    geo = geometry or packed_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_packed handles uint8 images with boxes of at most 257 rows")
    out, src, dst, n = flat_images(img, out, "box_packed", stream)
    kernel = packed_kernel(img.shape[2], geo["run"], geo["threads"], geo["even"])
    args = packed_args(img.shape, ksize, anchor, mode, cval, geo)
    args = (src, words(src), n // 4, *args, dst, words(dst))
    launch(kernel, geo["grid"], geo["threads"], args, stream, geo["smem"])
    return out


def box_tiled(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None,
              stream: int = 0):  # fmt: skip
    """Box filter of a uint8 (H, W, C) device image, one shared-memory tile per block
    (`kernels.box.tiled`); `geometry` from `kernels.box.plan.tiled_plan`. Queued on
    `stream`. Raises ValueError when the plan says the case is not handled, `out` has
    another shape, or the image or `out` does not start on a 4-byte boundary.
    """
    geo = geometry or tiled_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_tiled handles uint8 images with boxes small next to its tiles")
    if out is not None and tuple(out.shape) != tuple(img.shape):
        raise ValueError(
            f"box_tiled: out has shape {tuple(out.shape)}, the image {tuple(img.shape)}"
        )
    kernel = _tiled_ref(img.shape[2], ksize, geo)
    scalars = tiled_args(img.shape, ksize, anchor, mode, cval, geo)
    out, src, dst, n = flat_images(img, out, "box_tiled", stream)
    if start_address(out) % 4:
        raise ValueError("box_tiled writes 32-bit words: out must start on a 4-byte boundary")
    args = (src, words(src), n // 4, *scalars, dst, words(dst))
    launch(kernel, geo["grid"], geo["threads"], args, stream, geo["smem"])
    return out


def row_pass(img, ksize: tuple, anchor: tuple, mode: int, cval, geo: dict, stream: int = 0):
    """Queue box_twopass's row pass of `img` ((H, W, C) uint8 device array starting on
    a 4-byte boundary) on `stream`; returns the scratch of row sums, (H * pitch16 // 2,)
    uint32 words (from the stream's pool: keep it until the column pass is queued)."""
    n = img.size
    src8 = img.reshape(n)
    sums32 = scratch((img.shape[0] * geo["pitch16"] // 2,), np.uint32, stream)
    row, _ = twopass_args(img.shape, ksize, anchor, mode, cval, geo)
    args = (src8, words(src8), *row, sums32)
    kernel = twopass_row_kernel(img.shape[2], geo["run"])
    launch(kernel, geo["row_grid"], geo["row_threads"], args, stream, geo["row_smem"])
    return sums32


def column_pass(sums32, ksize: tuple, anchor: tuple, mode: int, cval, geo: dict, out,
                stream: int = 0):  # fmt: skip
    """Queue box_twopass's column pass on `stream`: `out` ((H, W, C) uint8 device
    array) from the row sums; returns `out`."""
    _, args = twopass_args(out.shape, ksize, anchor, mode, cval, geo)
    args = (sums32, *args, out.reshape(out.size))
    launch(twopass_column_kernel(geo), geo["col_grid"], geo["col_block"], args, stream,
           geo["col_smem"])  # fmt: skip
    return out


def box_twopass(img, ksize, anchor, mode, cval, out=None, geometry: dict | None = None,
                stream: int = 0):  # fmt: skip
    """Box filter of a uint8 image in two passes of running sums (`kernels.box.twopass`);
    `geometry` from `kernels.box.plan.twopass_plan`. The image must start on a 4-byte
    boundary (the row pass reads 32-bit words; `kernels.box.dispatch.box_choice` sends
    other views elsewhere). Raises ValueError when the plan says the case is not
    handled or the image is not aligned. Queued on `stream`; the row sums' scratch
    comes from its pool.
    """
    geo = geometry or twopass_plan(img.shape, img.dtype, ksize)
    if geo is None:
        raise ValueError("box_twopass handles uint8 images with boxes up to 257 columns")
    if start_address(img) % 4:
        raise ValueError(
            "box_twopass reads 32-bit words: the image must start on a 4-byte boundary"
        )
    if out is None:
        out = empty(img.shape, img.dtype, stream)
    sums32 = row_pass(img, ksize, anchor, mode, cval, geo, stream)
    return column_pass(sums32, ksize, anchor, mode, cval, geo, out, stream)
