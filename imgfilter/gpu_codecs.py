"""JPEG files decoded and encoded on the GPU (NVIDIA nvImageCodec), for the many-files
commands' ``--gpu-codecs`` (``pip install "imgfilter[nvimgcodec]"``).

On a folder of photos the CPU's JPEG codecs, not the filter, set the pace; the GPU's
hardware decoder and its CUDA encoder take them off the CPU.

`GpuJpeg.decode` takes a file's bytes to the GPU when OpenCV would read them as an
8-bit, 3-channel BGR image and do nothing more: a whole JPEG (the structure check of
`imgfilter.io.read_image`) of 3 components of 8 bits, without an EXIF rotation. It
decodes into device memory as interleaved BGR, with libjpeg-turbo's "fancy" chroma
upsampling as OpenCV decodes, so the pixels are OpenCV's but for rounding (on
2167x2495 photos 0.012% of the values differ, by 1). Any other file (PNG, TIFF, gray
or CMYK JPEG, a rotated photo), or a JPEG the GPU decoder refuses, gives None: the
caller reads it with the CPU codecs as without the flag.

`GpuJpeg.encode` writes a uint8 BGR device image as a JPEG of the given quality with
4:2:0 chroma, as OpenCV does by default (the bytes are nvJPEG's, not libjpeg's).

Each thread gets its own decoder and encoder on first use. A call works on the calling
thread's default stream and waits for it, so its result may be used from any thread.
A `GpuJpeg` holds only its settings: it pickles, for the workers of a Dask cluster.
"""

from __future__ import annotations

import threading
from typing import Any

from kernels.common.devarray import PER_THREAD, DeviceArray, as_device_array

from . import io

DEFAULT_QUALITY = 95
EXTRA_HINT = 'pip install "imgfilter[nvimgcodec]"'

_local = threading.local()  # this thread's decoder and encoder


class Counts:
    """Files this process decoded and encoded on the GPU, and files the CPU codecs
    read instead (thread-safe; `snapshot` for the summary)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.decoded = self.encoded = self.cpu_decoded = 0

    def add(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def snapshot(self) -> tuple[int, int, int]:
        with self._lock:
            return self.decoded, self.encoded, self.cpu_decoded


COUNTS = Counts()


def unavailable() -> str | None:
    """Why GPU codecs cannot run here (nvImageCodec missing or without nvJPEG), or None."""
    try:
        nv = _nv()
    except ImportError as exc:
        return f"GPU codecs need NVIDIA nvImageCodec: {EXTRA_HINT} ({exc})"
    if not hasattr(nv, "Decoder"):
        return f"GPU codecs need NVIDIA nvImageCodec: {EXTRA_HINT}"
    return None


def _nv() -> Any:
    from nvidia import nvimgcodec

    return nvimgcodec


def _synchronize() -> None:
    from kernels.common.cudadrv import driver

    driver().synchronize(PER_THREAD)


class GpuJpeg:
    """JPEG codecs on the GPU (see the module docstring). quality: 0-100, for `encode`."""

    def __init__(self, quality: int | None = None) -> None:
        self.quality = DEFAULT_QUALITY if quality is None else int(quality)

    def decode(self, data: bytes) -> DeviceArray | None:
        """The (H, W, 3) uint8 BGR device image of a JPEG file's bytes, or None where
        the CPU codecs must read it."""
        image = self._decode(data)
        COUNTS.add("cpu_decoded" if image is None else "decoded")
        return image

    def _decode(self, data: bytes) -> DeviceArray | None:
        if not gpu_decodable(data):
            return None
        nv = _nv()
        stream = nv.CodeStream(data)
        if stream.num_channels != 3 or stream.precision != 8:
            return None
        decoder, _ = _codecs()
        params = nv.DecodeParams(
            apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
            allow_any_depth=False, sample_format=nv.SampleFormat.I_BGR,
        )  # fmt: skip
        image = decoder.decode(stream, params=params, cuda_stream=PER_THREAD)
        if image is None:
            return None
        _synchronize()
        view = as_device_array(image)
        if view.shape != (stream.height, stream.width, 3) or not view.is_c_contiguous:
            return None
        # Ready on every stream now: later work may queue it on any thread's stream.
        return DeviceArray(view.ptr, view.shape, view.dtype, None, PER_THREAD, image)

    def wait(self, result: Any) -> None:
        """Wait for a device result queued on the calling thread's default stream (so
        another thread may encode it); a host result is ready already."""
        if isinstance(result, DeviceArray):
            _synchronize()

    @staticmethod
    def encodable(target: Any, img: Any) -> bool:
        """Whether `encode` writes `img` to `target` (`gpu_encodable`)."""
        return gpu_encodable(target, img)

    @staticmethod
    def counts() -> tuple[int, int, int]:
        """(decoded, encoded on the GPU, read with the CPU codecs) in this process."""
        return COUNTS.snapshot()

    def encode(self, img: Any) -> memoryview:
        """JPEG file contents of a C-contiguous (H, W, 3) uint8 BGR device image, after
        the work queued on the calling thread's default stream."""
        nv = _nv()
        _, encoder = _codecs()
        source = nv.as_image(img, PER_THREAD, sample_format=nv.SampleFormat.I_BGR)
        params = nv.EncodeParams(
            quality_type=nv.QualityType.QUALITY, quality_value=float(self.quality),
            chroma_subsampling=nv.ChromaSubsampling.CSS_420,
        )  # fmt: skip
        coded = encoder.encode(source, ".jpg", params=params, cuda_stream=PER_THREAD)
        if coded is None:
            raise RuntimeError("the GPU JPEG encoder failed")
        COUNTS.add("encoded")
        return memoryview(coded)


def gpu_decodable(data: bytes) -> bool:
    """Whether a file's bytes are a whole JPEG without an EXIF rotation (what the GPU
    decoder may read as OpenCV would); the components are checked when decoding."""
    if io._sniff(data) != "jpeg":
        return False
    scan = io._SCANNERS["jpeg"](data)
    return scan.problem is None and io._exif_orientation(scan.exif) in (None, 1)


def gpu_encodable(target: Any, img: Any) -> bool:
    """Whether `encode` writes `img` (a device image) to `target`: a .jpg/.jpeg output of
    a C-contiguous (H, W, 3) uint8 image."""
    return (
        io.format_for(target).name == "JPEG"
        and isinstance(img, DeviceArray)
        and img.ndim == 3
        and img.shape[2] == 3
        and img.dtype.name == "uint8"
        and img.is_c_contiguous
    )


def _codecs() -> tuple[Any, Any]:
    """This thread's (decoder, encoder)."""
    pair = getattr(_local, "pair", None)
    if pair is None:
        nv = _nv()
        decoder = nv.Decoder(options=":fancy_upsampling=1")
        pair = _local.pair = (decoder, nv.Encoder())
    return pair
