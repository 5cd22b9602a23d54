"""Build the kernels shipped in the package: kernels/prebuilt/ (`kernels.common.shipped`).

Two users, no compile on a first use:
- the quick start (`imgfilter.backends.cached`, without Numba): the size-generic
  kernels that stand in for the size-specialised ones while those compile in the
  background (box_twopass for uint8 boxes, conv's window kernel for filters), the
  kernels that are generic already (box_fused, contour, conv's window for kernels
  larger than 31x31) and conv's tiled kernel (method tiled);
- the launch layer (`kernels.common.launch`; without Numba for the kernels it names by
  `kernels.common.refs.KernelRef`): every kernel the workloads here compile: the ones
  above, box_running, softmax on common widths, GEMV on common shapes, and the
  classifier's training and prediction.
Each is compiled by Numba exactly as imgfilter compiles it (by running the workloads
once) and then built for every GPU generation in ARCHS from the same NVVM IR.

Needs a CUDA GPU (Numba compiles device functions for the GPU it runs on) and the
CUDA toolchain of the cu13 extra. Run from the repository root:

    python tools/build_cubins.py [--out kernels/prebuilt]

It replaces the folder's contents: `<name>-sm<XY>.cubin` files and manifest.json (see
`kernels.common.shipped`). Rebuild after editing a shipped kernel's sources: a kernel whose
sources' digest no longer matches is compiled instead, and tests/test_prebuilt.py
fails until the kernels are rebuilt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
CHANNELS = (1, 3, 4)


def _random(shape: tuple, dtype, rng) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    return rng.integers(0, np.iinfo(dt).max, shape, endpoint=True).astype(dt)


def _tall_box(channels: int) -> tuple[int, int]:
    """A box tall enough that box_twopass's column pass runs without shared tiles."""
    from kernels.box import plan as box_plan

    for kh in range(33, 4096, 2):
        geo = box_plan.twopass_plan((64, 96, channels), np.uint8, (kh, 3))
        if geo is not None and geo["col_groups"] == 0:
            return kh, 3
    raise RuntimeError("no box makes box_twopass's column pass untiled")


def _twopass(backend, rng):
    """(name, dispatcher, array dtypes) of box_twopass's row and column passes."""
    from imgfilter.backends import cubins
    from kernels.box import plan as box_plan
    from kernels.box import twopass as box_twopass

    for channels in CHANNELS:
        for ksize in ((33, 33), _tall_box(channels)):
            img = _random((64, 96, channels), np.uint8, rng)
            method, geo = box_plan.choose(img.shape, img.dtype, ksize)
            assert method == "twopass", method
            backend.box(img, ksize, (ksize[0] // 2, ksize[1] // 2), 0, 0.0, "auto")
            rows, columns = cubins.twopass_names(channels, geo)
            row_kernel = box_twopass.row_kernel_for(channels, geo["run"])
            yield rows, row_kernel, (np.uint8, np.uint32, np.uint32)
            yield columns, box_twopass.column_kernel_for(geo), (np.uint32, np.uint8)


def _fused_boxes(dtype, channels: int) -> dict:
    """{cubin name: a box the plan runs through it} for box_fused on `dtype` images: the
    name varies with the column sums' type (the box's height) and the rounding (its area),
    and no box wider than 995 columns fits box_fused's tile: boxes up to 399 x 1099 find
    every name."""
    from imgfilter.backends import cubins
    from kernels.box import plan as box_plan

    boxes: dict = {}
    for kh in range(1, 400):
        for kw in range(1, 1100):
            method, geo = box_plan.choose((64, 96, channels), dtype, (kh, kw))
            if method == "fused":
                boxes.setdefault(cubins.box_name(geo, channels, dtype), (kh, kw))
    return boxes


def _fused(backend, rng):
    """box_fused for uint8 and uint16 images: every (sum type, rounding) the plan picks."""
    from kernels.box import fused as box_fused
    from kernels.box import plan as box_plan

    for dtype in (np.uint8, np.uint16):
        for channels in CHANNELS:
            for name, ksize in _fused_boxes(dtype, channels).items():
                img = _random((64, 96, channels), dtype, rng)
                backend.box(img, ksize, (ksize[0] // 2, ksize[1] // 2), 0, 0.0, "auto")
                _, geo = box_plan.choose(img.shape, dtype, ksize)
                kernel = box_fused.kernel_for(geo["sum_type"], channels, geo["magic_rounding"])
                yield name, kernel, (dtype, dtype)


def _contour(backend, rng):
    from imgfilter.backends import cubins
    from kernels.contour import kernel as contour

    for dtype in (np.uint8, np.uint16):  # contour takes integer images
        for channels in CHANNELS:
            backend.contour(_random((40, 56, channels), dtype, rng), 0, 0, "auto")
            yield cubins.contour_name(channels, dtype), contour.kernel_for(channels), (dtype,) * 4


def _conv_tiled(backend, rng):
    from imgfilter.backends import cubins
    from kernels.conv import generic as conv

    kernel = rng.standard_normal((5, 5)).astype(np.float32)
    for dtype in (np.uint8, np.uint16, np.float32):
        backend.correlate(_random((40, 56, 3), dtype, rng), kernel, (2, 2), 0, 0.0, "tiled")
        yield cubins.conv_tiled_name(dtype), conv.correlate_tiled, (dtype, np.float32, dtype)


def _conv_window(backend, rng):
    from imgfilter.backends import cubins
    from kernels.conv import window as conv

    kernel = rng.standard_normal((5, 5)).astype(np.float32)
    for dtype in (np.uint8, np.uint16, np.float32):
        backend.correlate(_random((40, 56, 3), dtype, rng), kernel, (2, 2), 0, 0.0, "window")
        yield cubins.conv_window_name(dtype), conv.correlate_window, (dtype, np.float32, dtype)


def _running(rng) -> None:
    """box_running (`kernels.box.running`), which takes any box: the box of float32
    images and of the boxes the one-pass kernels decline, for every dtype and both
    staging types of its row pass."""
    from kernels.box.running import box_running
    from kernels.common import devarray

    for dtype in (np.uint8, np.uint16, np.float32):
        for ksize in ((3, 3), (257, 257)):
            img = devarray.to_device(_random((40, 56, 3), dtype, rng), 0)
            box_running(img, ksize, (ksize[0] // 2, ksize[1] // 2), 0, 0.0, None, 0)


def _softmax(rng) -> None:
    """Softmax as `kernels.softmax.softmax` runs it on a few common widths (each width
    and pack size is a kernel of its own: shipping them all would weigh megabytes), and
    on the pixel classifier's: float32 rows of 2 to 16 classes, softmax (prediction)
    and log-softmax (training), even and odd row counts (the warp path reads two rows
    at a time where the count is even)."""
    from kernels.softmax import softmax

    for dtype in (np.float32, np.float16):
        for cols in (128, 1000, 1024, 4096):
            for rows in (1, 4096):
                softmax(rng.standard_normal((rows, cols)).astype(dtype))
    for classes in range(2, 17):
        for rows in (2, 3):
            for log in (False, True):
                softmax(rng.standard_normal((rows, classes)).astype(np.float32), log=log)


def _gemv(rng) -> None:
    """`kernels.linalg.gemv.gemv` on method auto's common shapes."""
    from kernels.linalg.gemv import gemv

    for dtype in (np.float32, np.float16):
        for n, k in ((1024, 1024), (4096, 4096), (999, 333)):
            gemv(rng.standard_normal((n, k)).astype(dtype), rng.standard_normal(k).astype(dtype))


def _classify(rng) -> None:
    """Training and classifying the sample photo as README's commands do, and the
    features of gray, 16-bit and float images."""
    from imgfilter import classify, io

    img = io.read_image(ROOT / "samples/astronaut.jpg")
    labels = io.read_image(ROOT / "samples/classify/astronaut.scribbles.png")
    model, _ = classify.train(img, labels, backend="cuda")
    for method in ("auto", "fused"):
        classify.predict(img, model, backend="cuda", method=method)
    # The features of gray, 16-bit and float images (their own preparing kernels).
    gray = np.ascontiguousarray(img[:, :, 1])
    for image in (gray, img.astype(np.uint16) * 257, img.astype(np.float32) / 255):
        classify.extract_features(image, backend="cuda")


def _recording_compiles() -> list:
    """Note every (dispatcher, argument types) the launch layer compiles from now on."""
    from kernels.common import launch

    noted: list = []
    compile_one = launch._compile

    def compile_and_note(kernel, args):
        compiled = compile_one(kernel, args)
        dispatcher = launch.dispatcher_of(kernel)
        argtypes = tuple(launch._numba_type(dispatcher, a) for a in args)
        noted.append((dispatcher, argtypes))
        return compiled

    launch._compile = compile_and_note
    return noted


def _export(dispatcher, argtypes: tuple, name: str, out: Path) -> str:
    """Write the overload's cubin for every generation in ARCHS; return its entry."""
    overload = dispatcher.overloads[argtypes]
    library = overload._codelibrary
    for cc in ARCHS:
        image = library.get_cubin(cc=cc)
        image = getattr(image, "code", image)
        (out / f"{name}-sm{cc[0]}{cc[1]}.cubin").write_bytes(bytes(image))
    return library._entry_name


def build(out: Path) -> dict:
    """Compile every shipped kernel, write its cubins for ARCHS and the manifest into
    `out` (emptied first); return the manifest. Kernels are stored under the launch
    layer's names; the quick start's names point at those files."""
    os.environ["IMGFILTER_CACHE_DIR"] = tempfile.mkdtemp(prefix="imgfilter-build-")
    os.environ["IMGFILTER_NO_PREBUILT"] = "1"
    from imgfilter.backends import cubins
    from imgfilter.backends import cuda as backend
    from kernels.common import shipped

    rng = np.random.default_rng(0)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    noted = _recording_compiles()
    named = [spec for specs in (_twopass, _fused, _contour, _conv_tiled, _conv_window)
             for spec in specs(backend, rng)]  # fmt: skip
    for workload in (_running, _softmax, _gemv, _classify):
        workload(rng)
    kernels: dict[str, dict] = {}
    keys: dict = {}  # (dispatcher, argtypes) -> launch name
    for dispatcher, argtypes in noted:
        key = shipped.signature_key(dispatcher, argtypes)
        if key is None or key in kernels:
            continue
        entry = _export(dispatcher, argtypes, key, out)
        modules = [shipped.module_of(dispatcher)]
        listed = shipped.closure(tuple(modules))
        digest = shipped.files_digest(tuple(listed))
        kernels[key] = {"entry": entry, "modules": modules, "closure": listed, "digest": digest}
        keys[id(dispatcher), argtypes] = key
    for name, dispatcher, dtypes in named:
        wanted = [np.dtype(dt).name for dt in dtypes]
        (key,) = {
            k for (d, argtypes), k in keys.items()
            if d == id(dispatcher)
            and [str(t.dtype) for t in argtypes if hasattr(t, "dtype")] == wanted
        }  # fmt: skip
        modules = list(cubins.family_modules(name))
        listed = shipped.closure(tuple(modules))
        digest = shipped.files_digest(tuple(listed))
        entry = kernels[key]["entry"]
        kernels[name] = {"entry": entry, "modules": modules, "closure": listed, "digest": digest,
                         "file": key}  # fmt: skip
    manifest = {"archs": [f"sm{a}{b}" for a, b in ARCHS], "kernels": dict(sorted(kernels.items()))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "kernels/prebuilt")
    args = parser.parse_args()
    manifest = build(args.out)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"{len(manifest['kernels'])} kernels x {len(ARCHS)} GPU generations: "
          f"{size / 2**20:.1f} MiB in {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
