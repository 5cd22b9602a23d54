"""EXIF and ICC profiles carried from an input to an output, through Pillow.

`read_metadata` takes a file's EXIF block and ICC profile as Pillow finds them while it
parses the header (the pixels are not decoded). `write_image(..., metadata=)` puts them
into JPEG and WebP outputs by encoding those with Pillow (`save(exif=..., icc_profile=...)`;
its JPEG coding of the pixels is libjpeg's, as OpenCV's), and into PNG outputs as iCCP
and eXIf chunks after OpenCV's IHDR (Pillow writes no 16-bit colour PNG). The EXIF
orientation is set to 1: `read_image` has already turned the pixels upright.
"""

from __future__ import annotations

import os
import struct
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import OutputError
from .io_pillow import pillow_open, to_bgr_order
from .io_read import NPY_MAGIC, open_input

# Formats `write_image` can put metadata into.
METADATA_FORMATS = ("JPEG", "PNG", "WebP")
_EXIF_PREFIX = b"Exif\x00\x00"
_JPEG_EXIF_MAX = 65533 - 8  # one APP1 segment, less its "Exif\0\0" and length


@dataclass(frozen=True)
class ImageMetadata:
    """What `read_metadata` found: the EXIF block (TIFF-structured, without the
    "Exif\\0\\0" prefix) and the ICC profile, each None when absent."""

    exif: bytes | None = None
    icc: bytes | None = None

    def __bool__(self) -> bool:
        return bool(self.exif or self.icc)


def read_metadata(path: str | os.PathLike[str]) -> ImageMetadata:
    """The EXIF block of a JPEG, PNG or WebP file and the ICC profile of any file Pillow
    opens (JPEG, PNG, WebP, TIFF), for `write_image(..., metadata=)`. Only the file's
    header is parsed.

    Raises InputError as `read_image` does for a file that cannot be read (missing,
    empty, a directory, not a regular file); a file whose metadata cannot be parsed gives
    an empty ImageMetadata.
    """
    p = Path(path)
    with open_input(p) as f:
        if f.read(len(NPY_MAGIC)) == NPY_MAGIC:
            return ImageMetadata()
        f.seek(0)
        exif = icc = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with pillow_open(f) as im:
                    if im.format in ("JPEG", "PNG", "WEBP"):
                        exif = im.info.get("exif")
                    icc = im.info.get("icc_profile")
        except Exception:  # noqa: BLE001 - not a file Pillow parses: nothing to carry
            return ImageMetadata()
    if isinstance(exif, bytes) and exif.startswith(_EXIF_PREFIX):
        exif = exif[len(_EXIF_PREFIX) :]
    if not isinstance(exif, bytes) or exif[:2] not in (b"II", b"MM"):
        exif = None  # not a TIFF structure: nothing a reader could use
    return ImageMetadata(exif=exif, icc=icc if isinstance(icc, bytes) and icc else None)


def _upright_exif(exif: bytes) -> bytes:
    """The EXIF block with its Orientation (if any) set to 1, re-written by Pillow, with
    the "Exif\\0\\0" prefix; unchanged where Pillow cannot parse it."""
    from PIL import Image

    upright = Image.Exif()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Corrupt EXIF data": what it parsed is kept
            upright.load(exif)
            if upright.get(0x0112, 1) == 1:
                return _EXIF_PREFIX + exif
            upright[0x0112] = 1
            return upright.tobytes()
    except Exception:  # noqa: BLE001 - a block Pillow cannot parse: carried as it is
        return _EXIF_PREFIX + exif


def pillow_encode(p: Path, name: str, img: np.ndarray, quality: int | None,
                  meta: ImageMetadata | None) -> bytes:  # fmt: skip
    """`img` (gray, BGR or BGRA uint8) encoded by Pillow as JPEG (quality 95 unless
    `quality`) or WebP (lossless with exact=True, which keeps the colour under
    transparent pixels, unless `quality`), with `meta`'s EXIF and ICC profile."""
    import io as _stdio

    from PIL import Image

    options: dict[str, Any] = {}
    if meta is not None and meta.icc:
        options["icc_profile"] = meta.icc
    if meta is not None and meta.exif:
        if name != "JPEG" or len(meta.exif) <= _JPEG_EXIF_MAX:
            options["exif"] = _upright_exif(meta.exif)
    if name == "JPEG":
        options["quality"] = 95 if quality is None else quality
    elif quality is None:
        options.update(lossless=True, exact=True)
    else:
        options["quality"] = max(1, quality)  # libwebp's lowest is 1, as for OpenCV
    out = _stdio.BytesIO()
    try:
        rgb = np.ascontiguousarray(to_bgr_order(img))  # the same swap: BGR(A) -> RGB(A)
        Image.fromarray(rgb).save(out, "JPEG" if name == "JPEG" else "WEBP", **options)
    except Exception as e:  # e.g. Pillow built without WebP
        raise OutputError(f"cannot write {p}: Pillow could not encode it as {name} ({e})") from e
    return out.getvalue()


def _png_chunk(ctype: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(ctype + body)
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", crc)


def png_with_metadata(data: bytes, meta: ImageMetadata) -> bytes:
    """A PNG file's bytes with iCCP and eXIf chunks right after IHDR (both must precede
    IDAT)."""
    chunks = b""
    if meta.icc:
        chunks += _png_chunk(b"iCCP", b"ICC profile\x00\x00" + zlib.compress(meta.icc))
    if meta.exif:
        exif = _upright_exif(meta.exif)[len(_EXIF_PREFIX) :]
        chunks += _png_chunk(b"eXIf", exif)
    end_of_ihdr = 8 + 12 + struct.unpack_from(">I", data, 8)[0]
    return data[:end_of_ihdr] + chunks + data[end_of_ihdr:]
