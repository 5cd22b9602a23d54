"""Pillow's part in reading: the formats OpenCV cannot decode, frames, EXIF orientation.

`decode` reads what OpenCV could not (into OpenCV's channel order and dtypes, upright
through `ImageOps.exif_transpose`), `frame_count` counts an animation's frames, and
`exif_orientation` reads the Orientation tag of an EXIF block. `pillow_open` lifts
Pillow's decompression-bomb limit to OpenCV's, which imgfilter follows. Pillow is
imported only inside these functions.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError
from .headers import pixel_limit

KIND_NAMES = {
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WebP",
    "tiff": "TIFF",
    "bmp": "BMP",
    "gif": "GIF",
}


def to_bgr_order(arr: np.ndarray) -> np.ndarray:
    """RGB -> BGR and RGBA -> BGRA (channel order only)."""
    if arr.ndim == 3 and arr.shape[2] == 3:
        return arr[..., ::-1]
    if arr.ndim == 3 and arr.shape[2] == 4:
        return arr[..., [2, 1, 0, 3]]
    return arr


def decode(data: bytes, p: Path, kind: str | None, cv_detail: str) -> np.ndarray:
    """Decode with Pillow (formats OpenCV lacks) into OpenCV's channel order and dtypes,
    upright (`ImageOps.exif_transpose`). InputError, naming `cv_detail` (why OpenCV
    could not) where Pillow cannot either or would narrow 16-bit colour to 8 bits."""
    import io as _stdio

    from PIL import ImageOps, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Corrupt EXIF data", decompression bombs
            with pillow_open(_stdio.BytesIO(data)) as im:
                deep = _pillow_narrows(im)
                im.load()
                arr = _pillow_array(ImageOps.exif_transpose(im))
    except Exception as e:  # Pillow raises many types for damaged data
        if isinstance(e, UnidentifiedImageError) and kind is None:
            raise InputError(
                f"cannot read {p}: not an image file (neither OpenCV nor Pillow recognises it)"
            ) from e
        what = f"{KIND_NAMES[kind]} file" if kind else "image file"
        if isinstance(e, UnidentifiedImageError) or not str(e).strip():
            detail = cv_detail or type(e).__name__  # Pillow's text names a BytesIO object
        else:
            detail = str(e).strip().splitlines()[0]
        raise InputError(f"cannot read {p}: corrupt or unsupported {what} ({detail})") from e
    if deep:
        raise InputError(
            f"cannot read {p}: OpenCV could not decode it ({cv_detail or 'no details'}) "
            "and Pillow would reduce its 16-bit colour samples to 8 bits"
        )
    return arr


def exif_orientation(payload: bytes | None) -> int | None:
    """The Orientation tag (0x0112) of a TIFF-structured EXIF block (with or without its
    "Exif\\0\\0" prefix), parsed by Pillow; None where absent, outside 1..8 or unparsable."""
    if not payload:
        return None
    from PIL import Image

    exif = Image.Exif()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Corrupt EXIF data": None below says it
            exif.load(bytes(payload))
            value = exif.get(0x0112)
    except Exception:  # noqa: BLE001 - a damaged block: no orientation
        return None
    return value if isinstance(value, int) and 1 <= value <= 8 else None


_PILLOW_LIMIT_LOCK = threading.Lock()


@contextlib.contextmanager
def pillow_open(source: Any) -> Iterator[Any]:
    """`PIL.Image.open(source)` with Pillow's decompression-bomb limit raised to
    imgfilter's (`headers.pixel_limit`, OpenCV's): by default Pillow refuses images of
    more than about 179 million pixels (2 x its MAX_IMAGE_PIXELS), scenes that OpenCV
    reads, whose ICC profile, frame count or Pillow-only format would then be lost. The
    limit is Pillow's module setting, checked while the header is parsed, so it is
    raised for that moment only, under a lock, and put back."""
    from PIL import Image

    with _PILLOW_LIMIT_LOCK:
        default = Image.MAX_IMAGE_PIXELS
        if default is not None:
            Image.MAX_IMAGE_PIXELS = max(default, pixel_limit())
        try:
            im = Image.open(source)
        finally:
            Image.MAX_IMAGE_PIXELS = default
    with im:
        yield im


def _pillow_narrows(im: Any) -> bool:
    """Whether Pillow will decode 16-bit samples into an 8-bit mode (it has no 16-bit RGB).

    Decided from the raw modes of the not-yet-loaded image's tiles, such as "RGB;16B".
    """
    if im.mode.startswith("I") or im.mode == "F":
        return False
    for tile in im.tile or ():
        args = tile[3] if len(tile) > 3 else None
        raw = args[0] if isinstance(args, tuple) and args else args
        if isinstance(raw, str) and ";16" in raw:
            return True
    return False


def _pillow_array(im: Any) -> np.ndarray:
    """A loaded Pillow image as a numpy array in OpenCV's layout (BGR/BGRA, gray 2-D)."""
    mode = im.mode
    if mode == "1":
        im = im.convert("L")  # 0/255, as OpenCV reads 1-bit PNGs
    elif mode in ("P", "PA"):
        transparent = mode == "PA" or "transparency" in im.info
        im = im.convert("RGBA" if transparent else "RGB")
    elif mode in ("LA", "La", "RGBa"):
        im = im.convert("RGBA")
    elif mode in ("L", "RGB", "RGBA", "I", "F") or mode.startswith("I;16"):
        pass
    else:  # CMYK, YCbCr, LAB, HSV, RGBX, ...
        im = im.convert("RGBA" if "A" in mode else "RGB")
    arr = np.asarray(im)
    if arr.dtype.byteorder not in ("=", "|"):  # I;16B
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return to_bgr_order(arr)


def _may_have_frames(data: bytes, kind: str | None) -> bool:
    """Whether the file can hold more than one frame (cheap checks on the bytes)."""
    if kind in ("gif", "tiff"):
        return True
    if kind == "png":  # APNG: an acTL chunk before the first IDAT
        idat = data.find(b"IDAT")
        actl = data.find(b"acTL")
        return actl >= 0 and (idat < 0 or actl < idat)
    if kind == "webp":  # animated WebP: VP8X with its animation flag (0x02)
        return data[12:16] == b"VP8X" and len(data) > 20 and bool(data[20] & 0x02)
    return False


def frame_count(data: bytes, kind: str | None) -> int:
    """How many frames Pillow finds in the file (a TIFF's pages: `tiff.page_count`);
    1 when in doubt."""
    if not _may_have_frames(data, kind):
        return 1
    if kind == "tiff":
        from . import tiff

        return tiff.page_count(data)
    import io as _stdio

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pillow_open(_stdio.BytesIO(data)) as im:
                return int(getattr(im, "n_frames", 1))
    except Exception:  # a file Pillow cannot parse was read by OpenCV: one frame
        return 1
