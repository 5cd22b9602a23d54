"""Build the kernels shipped in the package: kernels/prebuilt/ (`kernels.common.shipped`).

No compile on a first use: the launch layer (`kernels.common.launch`, without Numba for
the kernels named by `kernels.common.refs.KernelRef`) finds here every kernel the
workloads below compile: the size-generic kernels that stand in for the
size-specialised ones while those compile in the background (box_twopass for uint8
boxes, conv's window kernel for filters), the kernels that are generic already
(box_fused, box_running, contour, conv's window and tiled kernels), softmax on common
widths, GEMV on common shapes, and the classifier's training and prediction.
Each is compiled by Numba exactly as imgfilter compiles it (by running the workloads
once) and then built for every GPU generation in ARCHS from the same NVVM IR, into one
fatbin per kernel (`<name>.fatbin`, a cubin per generation, uncompressed so that any
driver loads it) beside manifest.json (see `kernels.common.shipped`).

Reproducible: a rebuild from the same sources writes the same bytes, and editing one
kernel changes only the files of the kernels compiled from it. Numba names each
compiled function with a process-wide counter (the "v<n>" ABI tag of its mangled name)
and hands NVVM a kernel's IR modules in set order, so the binaries it makes depend on
what else the process compiled. `_canonical_ir` renumbers those tags by first
appearance in an order made from the IR alone (the kernel's module, then each module
after the first that calls into it), and the binaries are built from that IR; the
manifest is written with sorted keys and no times.

Needs a CUDA GPU (the workloads run; Numba compiles device functions for the GPU it
runs on), the CUDA toolchain of the cu13 extra (numba-cuda 0.30) and NVIDIA's fatbin
library (`pip install "cuda-toolkit[nvfatbin]==13.0.*"`; found through cuda.bindings,
or LD_LIBRARY_PATH). Run from the repository root:

    python tools/build_cubins.py [--out kernels/prebuilt]
    python tools/build_cubins.py --check [DIR]

The first replaces the folder's contents once the build has succeeded. Rebuild after
editing a shipped kernel's sources: a kernel whose sources' digest no longer matches is
compiled instead, and tests/test_prebuilt.py fails until the kernels are rebuilt.
--check builds into a temporary folder and compares it with DIR (default
kernels/prebuilt) byte for byte: it lists the files that differ and exits 1 if any does
(a GPU machine's CI check that the shipped binaries are the sources').
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
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


def _twopass(backend, rng) -> None:
    """box_twopass's row and column passes (the stand-in for auto's size-specialised
    uint8 box kernels while they compile), tiled and untiled columns."""
    from kernels.box import plan as box_plan

    for channels in CHANNELS:
        for ksize in ((33, 33), _tall_box(channels)):
            img = _random((64, 96, channels), np.uint8, rng)
            method, _ = box_plan.choose(img.shape, img.dtype, ksize)
            assert method == "twopass", method
            backend.box(img, ksize, (ksize[0] // 2, ksize[1] // 2), 0, 0.0, "auto")


def _fused_boxes(dtype, channels: int) -> list:
    """A box for each box_fused kernel the plan picks on `dtype` images: the kernel
    varies with the column sums' type (the box's height) and the rounding (its area),
    and no box wider than 995 columns fits box_fused's tile: boxes up to 399 x 1099
    find every kernel."""
    from kernels.box import plan as box_plan

    boxes: dict = {}
    for kh in range(1, 400):
        for kw in range(1, 1100):
            method, geo = box_plan.choose((64, 96, channels), dtype, (kh, kw))
            if method == "fused":
                boxes.setdefault((np.dtype(geo["sum_type"]).name, geo["magic_rounding"]),
                                 (kh, kw))  # fmt: skip
    return list(boxes.values())


def _fused(backend, rng) -> None:
    """box_fused for uint8 and uint16 images: every (sum type, rounding) the plan picks."""
    for dtype in (np.uint8, np.uint16):
        for channels in CHANNELS:
            for ksize in _fused_boxes(dtype, channels):
                img = _random((64, 96, channels), dtype, rng)
                backend.box(img, ksize, (ksize[0] // 2, ksize[1] // 2), 0, 0.0, "auto")


def _contour(backend, rng) -> None:
    for dtype in (np.uint8, np.uint16):  # contour takes integer images
        for channels in CHANNELS:
            backend.contour(_random((40, 56, channels), dtype, rng), 0, 0, "auto")


def _conv_generic(backend, rng) -> None:
    """conv's tiled and window kernels (method tiled; window: the stand-in for the
    register-blocked kernel while it compiles, and auto's for kernels it does not take)."""
    kernel = rng.standard_normal((5, 5)).astype(np.float32)
    for method in ("tiled", "window"):
        for dtype in (np.uint8, np.uint16, np.float32):
            img = _random((40, 56, 3), dtype, rng)
            backend.correlate(img, kernel, (2, 2), 0, 0.0, method)


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
    """Note every (binary name, dispatcher, argument types) the launch layer compiles
    from now on."""
    from kernels.common import launch

    noted: list = []
    compile_one = launch._compile

    def compile_and_note(kernel, args, name=None, modules=None):
        compiled = compile_one(kernel, args, name, modules)
        dispatcher = launch.dispatcher_of(kernel)
        argtypes = tuple(launch._numba_type(dispatcher, a) for a in args)
        noted.append((name or launch._name(kernel, args), dispatcher, argtypes))
        return compiled

    launch._compile = compile_and_note
    return noted


_DIGITS = re.compile(r"\d+")


def _uid_tags(text: str) -> list[tuple[int, int, int]]:
    """(start, end, counter) of the "B<len>v<n>" ABI tag of every Numba-mangled name
    ("_ZN" then length-prefixed parts and "B"-prefixed tags) in `text`."""
    found = []
    start = text.find("_ZN")
    while start != -1:
        i = start + 3
        while i < len(text) and (text[i].isdigit() or text[i] == "B"):
            j = i + (text[i] == "B")
            digits = _DIGITS.match(text, j)
            if digits is None:
                break
            body = digits.end()
            end = body + int(digits.group())
            tag = re.fullmatch(r"v(\d+)", text[body:end]) if text[i] == "B" else None
            if tag is not None:
                found.append((i, end, int(tag.group(1))))
            i = end
        start = text.find("_ZN", i)
    return found


_MODULE_ID = re.compile(r'^(; ModuleID = ".*?)\$\d+"', re.M)
_DEFINED = re.compile(r'^define [^@\n]*@("[^"]+"|[\w.$]+)\(', re.M)
_DECLARED = re.compile(r'^declare [^@\n]*@("[^"]+"|[\w.$]+)\(', re.M)


def _renamed(text: str, numbers: dict[int, int] | None) -> str:
    """`text` with each Numba counter tag renumbered by `numbers` (blanked when None)
    and the counter dropped from the module's name."""
    parts, last = [], 0
    for start, end, uid in _uid_tags(text):
        tag = "" if numbers is None else f"v{numbers[uid]}"
        parts += [text[last:start], f"B{len(tag)}{tag}"]
        last = end
    return _MODULE_ID.sub(r'\1"', "".join(parts) + text[last:])


def _canonical_ir(modules: list[str]) -> tuple[list[str], dict[int, int]]:
    """A kernel's NVVM IR modules (Numba's `llvm_strs`: the kernel's first) in an order
    and with names that depend on the IR alone, and the counters' renumbering.

    Order: the kernel's module, then depth first, in the order each module declares
    them, the modules defining the functions it calls (NVVM drops a linkonce_odr
    definition that no module before it calls), each once; any module left over at
    the end. Ties go by the text with counters blanked."""
    key = [_renamed(m, None) for m in modules]
    definers: dict[str, list[int]] = {}
    for i, module in enumerate(modules):
        for name in _DEFINED.findall(module):
            definers.setdefault(name, []).append(i)
    ordered: list[int] = []
    seen: set[str] = set()

    def visit(i: int) -> None:
        if modules[i] in seen:
            return
        seen.add(modules[i])
        ordered.append(i)
        for name in _DECLARED.findall(modules[i]):
            for j in sorted(definers.get(name, ()), key=key.__getitem__):
                visit(j)

    visit(0)
    for i in sorted(range(len(modules)), key=key.__getitem__):
        if modules[i] not in seen:
            seen.add(modules[i])
            ordered.append(i)
    numbers: dict[int, int] = {}
    for i in ordered:
        for _, _, uid in _uid_tags(modules[i]):
            numbers.setdefault(uid, len(numbers) + 1)
    return [_renamed(modules[i], numbers) for i in ordered], numbers


def _cubins(library) -> tuple[dict[tuple[int, int], bytes], str]:
    """({generation: cubin}, entry) of a compiled kernel (a numba-cuda CUDACodeLibrary),
    built from its canonical IR (`_canonical_ir`) through Numba's own NVVM and linker
    steps, for every generation in ARCHS."""
    irs, numbers = _canonical_ir(list(library.llvm_strs))
    canonical = object.__new__(type(library))
    canonical.__dict__.update(library.__dict__)
    canonical._llvm_strs = irs
    for cache in ("_ptx_cache", "_ltoir_cache", "_cubin_cache", "_linkerinfo_cache"):
        setattr(canonical, cache, {})
    images = {}
    for cc in ARCHS:
        image = canonical.get_cubin(cc=cc)
        image = getattr(image, "code", image)  # a cuda.core ObjectCode
        images[cc] = Path(image).read_bytes() if isinstance(image, str) else bytes(image)
    return images, _renamed(library._entry_name, numbers)


def _fatbin(cubins: dict[tuple[int, int], bytes], name: str) -> bytes:
    """One fatbin holding `cubins` ({(major, minor): cubin}), in ARCHS order,
    uncompressed (a compressed fatbin needs a newer driver than the cubins do)."""
    from cuda.bindings import nvfatbin

    options = ["-64", "-compress=false"]
    handle = nvfatbin.create(options, len(options))
    try:
        for cc in sorted(cubins, key=ARCHS.index):
            nvfatbin.add_cubin(handle, cubins[cc], len(cubins[cc]), f"{cc[0]}{cc[1]}", name)
        image = bytearray(nvfatbin.size(handle))
        nvfatbin.get(handle, image)
    finally:
        nvfatbin.destroy(handle)
    return bytes(image)


def _export(dispatcher, argtypes: tuple, name: str, out: Path) -> str:
    """Write the overload's fatbin (`<name>.fatbin`, every generation in ARCHS); return
    its entry."""
    from kernels.common import shipped

    cubins, entry = _cubins(dispatcher.overloads[argtypes]._codelibrary)
    (out / f"{name}{shipped.SUFFIX}").write_bytes(_fatbin(cubins, name))
    return entry


def build(out: Path) -> dict:
    """Compile every shipped kernel, write its fatbin (`_export`) and the manifest into
    `out` (a new folder); return the manifest. Kernels are stored under the launch
    layer's names (`kernels.common.shipped.launch_name`)."""
    os.environ["IMGFILTER_CACHE_DIR"] = tempfile.mkdtemp(prefix="imgfilter-build-")
    os.environ["IMGFILTER_NO_PREBUILT"] = "1"
    os.environ["IMGFILTER_BACKGROUND_COMPILE"] = "0"  # every kernel compiled here, at once
    from imgfilter.backends import cuda as backend
    from kernels.common import shipped

    rng = np.random.default_rng(0)
    out.mkdir(parents=True)
    noted = _recording_compiles()
    for filters in (_twopass, _fused, _contour, _conv_generic):
        filters(backend, rng)
    for workload in (_running, _softmax, _gemv, _classify):
        workload(rng)
    kernels: dict[str, dict] = {}
    for name, dispatcher, argtypes in noted:
        if name is None or name in kernels or name.startswith("var_shape-"):
            continue
        entry = _export(dispatcher, argtypes, name, out)
        modules = [shipped.module_of(dispatcher)]
        listed = shipped.closure(tuple(modules))
        digest = shipped.files_digest(tuple(listed))
        kernels[name] = {"entry": entry, "modules": modules, "closure": listed, "digest": digest}
    manifest = {"archs": [f"sm{a}{b}" for a, b in ARCHS], "kernels": dict(sorted(kernels.items()))}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def differing(built: Path, other: Path) -> list[str]:
    """The names of the files that differ between two folders or are in one only."""
    a, b = {p.name for p in built.iterdir()}, {p.name for p in other.iterdir()}
    _, mismatch, errors = filecmp.cmpfiles(built, other, sorted(a & b), shallow=False)
    return sorted({*mismatch, *errors, *(a ^ b)})


def _fatbin_problem() -> str | None:
    """Why no fatbin can be written here, or None."""
    try:
        from cuda.bindings import nvfatbin

        nvfatbin.version()
    except Exception as exc:  # noqa: BLE001 - a missing module or library, said in one line
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=ROOT / "kernels/prebuilt")
    where.add_argument(
        "--check", nargs="?", type=Path, const=ROOT / "kernels/prebuilt", metavar="DIR",
        help="build in a temporary folder and compare it with DIR byte for byte",
    )  # fmt: skip
    args = parser.parse_args()
    if args.check is not None and not args.check.is_dir():
        print(f"build_cubins: no folder {args.check}", file=sys.stderr)
        return 2
    problem = _fatbin_problem()
    if problem is not None:
        print(f"build_cubins: NVIDIA's fatbin library is needed ({problem}); "
              'pip install "cuda-toolkit[nvfatbin]==13.0.*"', file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory(prefix="imgfilter-prebuilt-") as tmp:
        built = Path(tmp) / "prebuilt"
        manifest = build(built)
        files = sorted(built.iterdir())
        size = sum(p.stat().st_size for p in files) / 2**20
        print(f"{len(manifest['kernels'])} kernels in {len(files) - 1} fatbins of {len(ARCHS)} "
              f"GPU generations: {size:.1f} MiB")  # fmt: skip
        if args.check is None:  # the folder is replaced only once the build has succeeded
            shutil.rmtree(args.out, ignore_errors=True)
            shutil.copytree(built, args.out)
            return 0
        differ = differing(built, args.check)
        print(f"{len(differ)} of {len(files)} files differ from {args.check}"
              + "".join(f"\n  {name}" for name in differ))  # fmt: skip
        return 1 if differ else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
