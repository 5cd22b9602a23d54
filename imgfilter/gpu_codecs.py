"""JPEG files decoded and encoded on the GPU (NVIDIA nvImageCodec), for the many-files
commands' ``--gpu-codecs`` (``pip install "imgfilter[nvimgcodec]"``).

On a folder of photos the CPU's JPEG codecs, not the filter, set the pace; the GPU's
hardware JPEG decoder and its CUDA encoder take them off the CPU.

`GpuJpeg.decode` takes a file's bytes to the GPU when OpenCV would read them as an
8-bit, 3-channel BGR image and do nothing more: a whole JPEG (the structure check of
`imgfilter.io.read_image`) of 3 components of 8 bits, without an EXIF rotation, at
least MIN_SIDE pixels wide and high (the chroma upsampling at the edges of narrower
images differs from libjpeg's by several levels). It decodes as interleaved BGR with
libjpeg-turbo's "fancy" chroma upsampling, as OpenCV decodes, so the pixels are
OpenCV's but for rounding (on 2167x2495 photos 0.012% of the values differ, by 1).
Any other file (PNG, TIFF, gray or CMYK JPEG, a rotated photo), or a JPEG the GPU
decoder refuses, gives None: the caller reads it with the CPU codecs.

`GpuJpeg.encode` writes a uint8 BGR device image as a JPEG of the given quality with
4:2:0 chroma, as OpenCV does by default (the bytes are nvJPEG's, not libjpeg's).

Batches: the GPU's decoder and encoder pay off on several images a call, and the
pipeline's codec threads each hold one image. So each call is handed to a `Batcher`:
one thread per codec takes every request waiting at that moment (up to BATCH) and
runs them as one call on a stream of its own, then answers each caller. The batches
grow by themselves while the codec is the bottleneck, and stay at one image when it is
not. A decoded image is copied out of the decoder's buffers (which the next batch
reuses, so no device memory is freed per image) into the memory pool of
`kernels.common.devarray`; it is complete when `decode` returns, so any thread may queue
work on it. `encode` expects a device image whose writes are complete (the caller
waited for its stream: `wait`).

A `GpuJpeg` holds only its settings: it pickles, for the workers of a Dask cluster,
and each process makes its own codecs on first use.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from kernels.common.devarray import PER_THREAD, DeviceArray, as_device_array, empty

from . import io

DEFAULT_QUALITY = 95
EXTRA_HINT = 'pip install "imgfilter[nvimgcodec]"'
BATCH = 16  # requests a codec takes at once, at most
MIN_SIDE = 16  # narrower or shorter JPEGs are left to the CPU codecs (see the docstring)


class Counts:
    """Files this process decoded and encoded on the GPU, and files the CPU codecs
    read instead (thread-safe; `snapshot` for the summary)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.decoded = self.encoded = self.cpu_decoded = 0

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> tuple[int, int, int]:
        with self._lock:
            return self.decoded, self.encoded, self.cpu_decoded


COUNTS = Counts()


class Batcher:
    """`work(items) -> results` (one result per item, in order) run for requests from
    many threads: `submit(item)` waits for its own result (or raises what `work`
    raised for its batch). One daemon thread runs `work` on every request waiting
    when it is free, up to `limit` at once."""

    def __init__(self, work: Callable[[list], Sequence], limit: int, name: str) -> None:
        self._work = work
        self._limit = limit
        self._name = name
        self._requests: queue.SimpleQueue[tuple[Any, Future]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.batches = 0  # batches run so far (tests and measurements)

    def submit(self, item: Any) -> Any:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name=self._name,
                                                    daemon=True)  # fmt: skip
                    self._thread.start()
        done: Future = Future()
        self._requests.put((item, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            batch = [self._requests.get()]
            while len(batch) < self._limit:
                try:
                    batch.append(self._requests.get_nowait())
                except queue.Empty:
                    break
            self.batches += 1
            try:
                results = self._work([item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"{self._name}: {len(results)} results for {len(batch)}")
            except BaseException as e:  # noqa: BLE001 - handed to every caller of the batch
                for _, done in batch:
                    done.set_exception(e)
                continue
            for (_, done), result in zip(batch, results, strict=True):
                done.set_result(result)


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


def _driver() -> Any:
    from kernels.common.cudadrv import driver

    return driver()


class _Decoder:
    """One nvImageCodec decoder on a stream of its own, and the images it reuses."""

    def __init__(self) -> None:
        nv = _nv()
        self.stream = _driver().stream_create()
        self.decoder = nv.Decoder(options=":fancy_upsampling=1")
        self.params = nv.DecodeParams(
            apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
            allow_any_depth=False, sample_format=nv.SampleFormat.I_BGR,
        )  # fmt: skip
        self.spare: list = []  # nvImageCodec images whose buffers the next batch reuses

    def __call__(self, datas: list[bytes]) -> list[DeviceArray | None]:
        nv = _nv()
        results: list[DeviceArray | None] = [None] * len(datas)
        wanted, sources = [], []
        for i, data in enumerate(datas):
            source = nv.CodeStream(data)
            if (source.num_channels == 3 and source.precision == 8
                    and min(source.height, source.width) >= MIN_SIDE):  # fmt: skip
                wanted.append(i)
                sources.append(source)
        if not sources:
            return results
        reuse = self.spare[: len(sources)] if len(self.spare) >= len(sources) else None
        images = self.decoder.decode(sources, images=reuse, params=self.params,
                                     cuda_stream=self.stream)  # fmt: skip
        drv = _driver()
        for i, source, image in zip(wanted, sources, images, strict=True):
            if image is None:
                continue
            view = as_device_array(image)
            shape = (source.height, source.width, 3)
            if view.shape != shape or not view.is_c_contiguous or view.dtype.name != "uint8":
                continue
            copy = empty(shape, view.dtype, self.stream)
            drv.copy(copy.ptr, view.ptr, copy.nbytes, self.stream)
            results[i] = copy
        drv.synchronize(self.stream)
        # Keep the buffers for later batches (a reused image comes back in `images`).
        unused = self.spare[len(sources) :] if reuse else self.spare
        self.spare = ([image for image in images if image is not None] + unused)[:BATCH]
        for copy in results:
            if copy is not None:
                # Complete now: later work may queue it on any thread's stream.
                copy.stream = PER_THREAD
        return results


class _Encoder:
    """One nvImageCodec encoder on a stream of its own."""

    def __init__(self, quality: int) -> None:
        nv = _nv()
        self.stream = _driver().stream_create()
        self.encoder = nv.Encoder()
        self.params = nv.EncodeParams(
            quality_type=nv.QualityType.QUALITY, quality_value=float(quality),
            chroma_subsampling=nv.ChromaSubsampling.CSS_420,
        )  # fmt: skip

    def __call__(self, images: list[DeviceArray]) -> list[bytes]:
        nv = _nv()
        sources = [nv.as_image(img, self.stream, sample_format=nv.SampleFormat.I_BGR)
                   for img in images]  # fmt: skip
        coded = self.encoder.encode(sources, ".jpg", params=self.params,
                                    cuda_stream=self.stream)  # fmt: skip
        _driver().synchronize(self.stream)
        if any(c is None for c in coded):
            raise RuntimeError("the GPU JPEG encoder failed")
        return [bytes(c) for c in coded]


_BATCHERS: dict[tuple, Batcher] = {}
_BATCHERS_LOCK = threading.Lock()


def _batcher(kind: str, quality: int | None = None) -> Batcher:
    """This process's decode batcher, or its encode batcher for `quality`."""
    key = (kind, quality)
    found = _BATCHERS.get(key)
    if found is None:
        with _BATCHERS_LOCK:
            found = _BATCHERS.get(key)
            if found is None:
                work = _Decoder() if kind == "decode" else _Encoder(quality or DEFAULT_QUALITY)
                found = _BATCHERS[key] = Batcher(work, BATCH, f"imgfilter-gpu-{kind}")
    return found


class GpuJpeg:
    """JPEG codecs on the GPU (see the module docstring). quality: 0-100, for `encode`."""

    def __init__(self, quality: int | None = None) -> None:
        self.quality = DEFAULT_QUALITY if quality is None else int(quality)

    def decode(self, data: bytes) -> DeviceArray | None:
        """The (H, W, 3) uint8 BGR device image of a JPEG file's bytes, complete, or
        None where the CPU codecs must read it."""
        image = _batcher("decode").submit(data) if gpu_decodable(data) else None
        COUNTS.add("cpu_decoded" if image is None else "decoded")
        return image

    def wait(self, result: Any) -> None:
        """Wait for a device result queued on the calling thread's default stream (so
        the encoder's thread may read it); a host result is ready already."""
        if isinstance(result, DeviceArray):
            _driver().synchronize(PER_THREAD)

    @staticmethod
    def encodable(target: Any, img: Any) -> bool:
        """Whether `encode` writes `img` to `target` (`gpu_encodable`)."""
        return gpu_encodable(target, img)

    @staticmethod
    def counts() -> tuple[int, int, int]:
        """(decoded, encoded on the GPU, read with the CPU codecs) in this process."""
        return COUNTS.snapshot()

    def encode(self, img: DeviceArray) -> bytes:
        """JPEG file contents of a complete, C-contiguous (H, W, 3) uint8 BGR device image."""
        data = _batcher("encode", self.quality).submit(img)
        COUNTS.add("encoded")
        return data


def gpu_decodable(data: bytes) -> bool:
    """Whether a file's bytes are a whole JPEG without an EXIF rotation (what the GPU
    decoder may read as OpenCV would); the components and size are checked when
    decoding."""
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
