"""The kernels shipped in the package (issue 24): the quick start's first use.

Without a GPU: the shipped manifest is current (its digests are the sources'), holds
every kernel the first-use paths ask for, each in a fatbin with a cubin for every GPU
generation it lists, and the folder holds those files only (at most 200); the store
prefers the user's cache and ignores stale or foreign shipped entries; a first
use runs the generic kernel and starts one background compile of the specialised one,
and goes to the Numba path when background compiles are off. On a GPU (`gpu`): a fresh
process with an empty cache filters from the shipped kernels without importing Numba
and gets exactly the Numba path's results.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from imgfilter.backends import background, cached, cubins
from kernels.box import plan as box_plan
from kernels.common import shipped

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = json.loads((shipped.DIRECTORY / "manifest.json").read_text())


def test_shipped_kernels_are_built_from_these_sources():
    stale = [
        name
        for name, entry in MANIFEST["kernels"].items()
        if entry["digest"] != shipped.sources_digest(tuple(entry["modules"]))
        or entry["closure"] != shipped.closure(tuple(entry["modules"]))
    ]
    assert not stale, f"rebuild with `python tools/build_cubins.py` on a GPU machine: {stale}"


def _fatbin_cubins(image: bytes) -> dict[str, bytes]:
    """{"sm<XY>": cubin} of a fatbin, read by its layout: a 16-byte header (magic
    0xBA55ED50, version, header size, size of the rest), then per entry a header (kind:
    2 for a cubin, version, header size, payload size; the generation at byte 28, the
    flags at byte 40) and its payload. Fails on anything but uncompressed cubins."""
    magic, _, header, size = struct.unpack_from("<IHHQ", image, 0)
    assert magic == 0xBA55ED50 and header + size == len(image), "not a fatbin"
    cubins, at = {}, header
    while at < len(image):
        kind, _, header, size = struct.unpack_from("<HHIQ", image, at)
        (arch,) = struct.unpack_from("<I", image, at + 28)
        (flags,) = struct.unpack_from("<Q", image, at + 40)
        payload = image[at + header : at + header + size]
        assert kind == 2 and not flags & 0xA000 and payload[:4] == b"\x7fELF", (kind, flags)
        assert f"sm{arch}" not in cubins, f"two cubins for sm{arch}"
        cubins[f"sm{arch}"] = payload
        at += header + size
    return cubins


def test_each_fatbin_holds_a_cubin_with_its_entry_for_every_listed_generation():
    entries: dict[str, set] = {}
    for name, entry in MANIFEST["kernels"].items():
        entries.setdefault(entry.get("file", name), set()).add(entry["entry"].encode())
    for file, symbols in entries.items():
        cubins = _fatbin_cubins((shipped.DIRECTORY / f"{file}{shipped.SUFFIX}").read_bytes())
        assert sorted(cubins) == sorted(MANIFEST["archs"]), file
        for arch, cubin in cubins.items():
            assert all(symbol in cubin for symbol in symbols), (file, arch)


def test_the_folder_holds_the_manifest_and_the_files_it_names_only():
    files = {entry.get("file", name) for name, entry in MANIFEST["kernels"].items()}
    named = {file + shipped.SUFFIX for file in files}
    present = {p.name for p in shipped.DIRECTORY.iterdir()}
    assert present - named == {"manifest.json"}, "files the manifest does not name"
    assert named <= present
    assert len(present) <= 200


def _build_tool():
    spec = importlib.util.spec_from_file_location("build_cubins", f"{ROOT}/tools/build_cubins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _symbol(function: str, n: int) -> str:
    """Numba's mangled name of `kernels.<function>`, its `n`-th compiled function."""
    return f"_ZN7kernels{len(function)}{function}B{len(str(n)) + 1}v{n}B4cw51Ex"


def _ir_module(name: str, uid: int, calls: dict[str, int]) -> str:
    """An IR module as Numba writes one: function `name`, compiled as Numba's `uid`-th
    function, calling `calls` ({name: their uid})."""
    return "\n".join([
        f'; ModuleID = "{name}${uid}"',
        f'define linkonce_odr i32 @"{_symbol(name, uid)}"() {{',
        *[f'  call i32 @"{_symbol(c, n)}"()' for c, n in calls.items()], "}",
        *[f'declare i32 @"{_symbol(c, n)}"()' for c, n in calls.items()],
    ])  # fmt: skip


def test_a_kernels_ir_is_made_canonical_whatever_the_process_compiled_before():
    """Numba's function counters and the order of a kernel's modules vary with what
    the process compiled before; the build's IR does not, and a module comes after
    the first that calls into it (else NVVM drops its linkonce_odr functions)."""
    tool = _build_tool()
    m = _ir_module
    first = [m("k", 1, {"f": 2, "g": 3}), m("f", 2, {"h": 4}), m("h", 4, {}), m("g", 3, {})]
    later = [m("k", 19, {"f": 17, "g": 5}), m("g", 5, {}), m("h", 18, {}), m("f", 17, {"h": 18}),
             m("h", 18, {})]  # fmt: skip
    (ir, numbers), (ir_later, numbers_later) = map(tool._canonical_ir, (first, later))
    assert ir == ir_later and "$" not in "".join(ir)
    defined = [re.search(r"kernels1(\w)B\d+v(\d+)", text).groups() for text in ir]
    assert defined == [("k", "1"), ("f", "2"), ("h", "4"), ("g", "3")]
    entry = tool._renamed(_symbol("k", 1), numbers)
    assert entry == tool._renamed(_symbol("k", 19), numbers_later) == _symbol("k", 1)
    assert tool._renamed(_symbol("k", 1), {1: 5}) == "_ZN7kernels1kB2v5B4cw51Ex"


def test_the_first_use_kernels_ship():
    names = set(MANIFEST["kernels"])
    for channels in (1, 3, 4):
        for ksize in ((3, 3), (21, 21), (31, 5), (1, 31)):
            geo = box_plan.twopass_plan((480, 640, channels), np.uint8, ksize)
            assert set(cubins.twopass_names(channels, geo)) <= names, (channels, ksize)
        for dtype in (np.uint8, np.uint16):
            assert cubins.contour_name(channels, dtype) in names
        boxes = {np.uint16: ((3, 3), (21, 21), (61, 61), (1, 600), (2, 300)),
                 np.uint8: ((3, 301), (1, 301), (300, 300), (140, 990), (300, 600))}  # fmt: skip
        for dtype, ksizes in boxes.items():
            for ksize in ksizes:
                method, geo = box_plan.choose((480, 640, channels), dtype, ksize)
                if method == "fused":  # else box_running, which always runs through Numba
                    assert cubins.box_name(geo, channels, dtype) in names, (dtype, ksize)
    for dtype in (np.uint8, np.uint16, np.float32):
        assert cubins.conv_tiled_name(dtype) in names
        assert cubins.conv_window_name(dtype) in names


def _write_manifest(folder, digest: str, entry="_Zcontour") -> None:
    manifest = {
        "archs": ["sm90"],
        "kernels": {
            "contour-uint8-c1": {"entry": entry, "modules": ["contour.kernel"], "digest": digest}
        },
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    shipped.manifest.cache_clear()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A shipped folder in tmp_path with one contour kernel for sm_90, and an empty cache."""
    folder = tmp_path / "prebuilt"
    folder.mkdir()
    (folder / f"contour-uint8-c1{shipped.SUFFIX}").write_bytes(b"shipped")
    monkeypatch.setattr(shipped, "DIRECTORY", folder)
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("IMGFILTER_NO_PREBUILT", raising=False)
    _write_manifest(folder, shipped.sources_digest(("contour.kernel",)))
    yield folder
    shipped.manifest.cache_clear()


def test_store_finds_shipped_kernels_for_listed_generations_only(folder):
    assert cubins.load("contour-uint8-c1", (9, 0)) == (b"shipped", "_Zcontour")
    assert cubins.load("contour-uint8-c1", (8, 0)) is None
    assert cubins.load("contour-uint8-c3", (9, 0)) is None
    assert cubins.any_for((9, 0)) and not cubins.any_for((8, 0))


def test_the_shipped_kernel_comes_first_and_the_cache_fills_in(folder):
    """A kernel that ships (built from these sources) is loaded from the package even
    where the user's cache holds one; the cache serves where none ships."""
    path = cubins._path("contour-uint8-c1", (9, 0))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"cached")
    path.with_suffix(".json").write_text(json.dumps({"entry": "_Zcached"}))
    assert cubins.load("contour-uint8-c1", (9, 0)) == (b"shipped", "_Zcontour")
    _write_manifest(folder, "0" * 16)  # the shipped one is stale: the cache's serves
    assert cubins.load("contour-uint8-c1", (9, 0)) == (b"cached", "_Zcached")


def test_stale_broken_or_switched_off_shipped_kernels_are_ignored(folder, monkeypatch):
    _write_manifest(folder, "0" * 16)  # built from other sources
    assert cubins.load("contour-uint8-c1", (9, 0)) is None
    _write_manifest(folder, shipped.sources_digest(("contour.kernel",)), entry=3)
    assert cubins.load("contour-uint8-c1", (9, 0)) is None
    (folder / "manifest.json").write_text("{broken")
    shipped.manifest.cache_clear()
    assert cubins.load("contour-uint8-c1", (9, 0)) is None and not cubins.any_for((9, 0))
    _write_manifest(folder, shipped.sources_digest(("contour.kernel",)))
    monkeypatch.setenv("IMGFILTER_NO_PREBUILT", "1")
    shipped.manifest.cache_clear()
    assert shipped.manifest() == {} and cubins.load("contour-uint8-c1", (9, 0)) is None


def test_host_modules_do_not_change_a_kernels_digest(tmp_path, monkeypatch):
    import shutil

    import kernels

    copy = tmp_path / "kernels"
    shutil.copytree(os.path.dirname(kernels.__file__), copy)
    monkeypatch.setattr(shipped, "_kernels_dir", lambda: copy)
    _clear_digests()
    try:
        before = shipped.sources_digest(("contour.kernel",))
        launch = copy / "common" / "launch.py"
        launch.write_text(launch.read_text() + "\n# host\n")
        _clear_digests()
        assert shipped.sources_digest(("contour.kernel",)) == before
        border = copy / "common" / "border_index.py"
        border.write_text(border.read_text() + "\n#\n")
        _clear_digests()
        assert shipped.sources_digest(("contour.kernel",)) != before  # contour imports border_index
    finally:
        _clear_digests()


def _clear_digests():
    shipped.files_digest.cache_clear()
    shipped._imports.cache_clear()


def test_a_recorded_closure_is_hashed_without_parsing(tmp_path, monkeypatch):
    """find() hashes the closure the build recorded (no source parsing in a user's
    process); an edit to any module in it still makes the kernel stale."""
    import shutil

    import kernels

    copy = tmp_path / "kernels"
    shutil.copytree(os.path.dirname(kernels.__file__), copy)
    monkeypatch.setattr(shipped, "_kernels_dir", lambda: copy)
    _clear_digests()
    listed = shipped.closure(("contour.kernel",))
    entry = {"modules": ["contour.kernel"], "closure": listed}
    digest = shipped.files_digest(tuple(listed))
    _clear_digests()

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed a source")

    monkeypatch.setattr(shipped.ast, "parse", no_parsing)
    try:
        assert shipped._entry_digest(entry) == digest
        border = copy / "common" / "border_index.py"
        border.write_text(border.read_text() + "\n#\n")
        _clear_digests()
        assert shipped._entry_digest(entry) != digest
        border.unlink()
        _clear_digests()
        assert shipped._entry_digest(entry) is None  # a module the build saw is gone
    finally:
        _clear_digests()


def _quick_runs(monkeypatch, missing: str):
    """Record the cubins the quick start asks for; `missing` (a name prefix) has none."""
    asked = []

    def run(name, img, out_shape, *args, **kwargs):
        asked.append(name)
        return None if name.startswith(missing) else np.zeros(out_shape, img.dtype)

    monkeypatch.setattr(cached, "_run", run)
    return asked


def test_first_box_of_a_size_runs_twopass_and_compiles_tiled_once(monkeypatch):
    asked = _quick_runs(monkeypatch, "box_tiled")
    started = []
    monkeypatch.setattr(background, "start", lambda name, code: started.append(name) or True)
    img = np.zeros((120, 160, 3), np.uint8)
    assert cached._box_quick(img, (21, 21), (10, 10), 4, 0) is not None
    method, geo = box_plan.choose(img.shape, img.dtype, (21, 21))
    tiled = cubins.tiled_name(geo, 3, (21, 21))
    twopass = box_plan.twopass_plan(img.shape, img.dtype, (21, 21))
    assert asked == [tiled, cubins.twopass_names(3, twopass)[0]]
    assert started == [tiled]


def test_without_background_compiles_a_first_box_goes_to_numba(monkeypatch):
    asked = _quick_runs(monkeypatch, "box_tiled")
    monkeypatch.setattr(background, "ENABLED", False)
    img = np.zeros((120, 160, 3), np.uint8)
    assert cached._box_quick(img, (21, 21), (10, 10), 4, 0) is None
    assert len(asked) == 1


def test_first_filter_of_a_size_runs_window_and_compiles_blocked(monkeypatch):
    asked = _quick_runs(monkeypatch, "blocked")
    started = []
    monkeypatch.setattr(background, "start", lambda name, code: started.append(code) or True)
    kernel = np.random.default_rng(0).random((11, 13)).astype(np.float32)
    img = np.zeros((50, 60, 1), np.uint16)
    cached._driver.cache_clear()
    monkeypatch.setattr(cached, "_driver", lambda: None)
    out = cached.correlate(img, kernel, (5, 6), 4, 0.0, "auto")
    assert out.shape == img.shape
    assert asked == ["blocked-uint16-11x13", "conv_window-uint16"]
    assert started == ["import imgfilter.backends.cuda as c; c.compile_blocked(11, 13, 'uint16')"]


@pytest.mark.parametrize(
    "ksize, method, want",
    [((41, 41), "auto", "conv_window"), ((64, 64), "auto", "conv_tiled"),
     ((5, 5), "window", "conv_window"), ((5, 5), "tiled", "conv_tiled")],
)  # fmt: skip
def test_generic_kernels_run_from_their_cubins(monkeypatch, ksize, method, want):
    """Kernels past the blocked kernel's 31x31 (not of low rank) run the window kernel,
    or tiled where window's tile does not fit, as do those methods asked for by name:
    all from their cubins, with nothing to compile."""
    asked = _quick_runs(monkeypatch, "none")
    monkeypatch.setattr(background, "start", lambda name, code: pytest.fail("compiled"))
    kernel = np.random.default_rng(1).random(ksize).astype(np.float32)
    img = np.zeros((50, 60, 3), np.uint8)
    out = cached.correlate(img, kernel, (ksize[0] // 2, ksize[1] // 2), 4, 0.0, method)
    assert out.shape == img.shape
    assert asked == [f"{want}-uint8"]


def test_one_background_compile_per_kernel_until_its_marker_goes_stale(tmp_path, monkeypatch):
    spawned = []
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(background, "ENABLED", True)
    monkeypatch.setattr(background.subprocess, "Popen", lambda argv, **kw: spawned.append(argv))
    assert background.start("box_tiled-x", "pass")
    assert background.start("box_tiled-x", "pass")  # at it already
    assert len(spawned) == 1 and spawned[0][1:] == ["-c", "pass"]
    marker = cubins.pending_marker("box_tiled-x")
    os.utime(marker, (0, 0))  # a compile that died long ago
    assert background.start("box_tiled-x", "pass") and len(spawned) == 2
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", "/proc/imgfilter-no-such-cache")
    assert not background.start("box_tiled-y", "pass")  # nowhere to leave a cubin


def _shipped_and_numba_runs(code: str, tmp_path) -> dict:
    """Run `code` (which saves its results to the .npz named by argv[1] and prints
    whether Numba was imported) in two fresh processes on a GPU: with the shipped
    kernels, and with every kernel compiled by Numba. {run: (its output, its .npz)}."""
    results = {}
    for run, extra in (
        ("shipped", {}),
        ("numba", {"IMGFILTER_NO_PREBUILT": "1", "IMGFILTER_NO_QUICK_START": "1"}),
    ):
        env = {**os.environ, "IMGFILTER_CACHE_DIR": str(tmp_path / run), **extra}
        env["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
        env["NUMBA_ENABLE_CUDASIM"] = "0"
        out = tmp_path / f"{run}.npz"
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(out)], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        results[run] = (done.stdout.strip(), np.load(out))
    return results


@pytest.mark.gpu
def test_fresh_process_filters_from_shipped_kernels_without_numba(tmp_path):
    code = """
        import sys
        import numpy as np
        import imgfilter
        rng = np.random.default_rng(5)
        outs = {}
        kern = rng.standard_normal((21, 21)).astype(np.float32) / 21
        for dtype in (np.uint8, np.uint16, np.float32):
            for c in (1, 3, 4):
                shape = (211, 333, c)
                if dtype == np.float32:
                    img = rng.standard_normal(shape).astype(dtype)
                else:
                    img = rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
                key = f"{np.dtype(dtype).name}-{c}"
                if dtype != np.float32:
                    outs["contour" + key] = imgfilter.contour(img, border="reflect")
                outs["filter" + key] = imgfilter.filter2d(img, kern, border="constant",
                                                          border_value=7)
                # float32: box_running; 301x3 uint8: box_fused (uint8 4-channel: box_packed,
                # specialised per size, not shipped)
                boxes = ((3, 3), (21, 21), (5, 17)) + (((301, 3),) if c < 4 else ())
                for k in boxes:
                    outs[f"blur{k}{key}"] = imgfilter.blur(img, k, border="wrap")
        np.savez(sys.argv[1], **outs)
        print("numba" in sys.modules)
        """
    results = _shipped_and_numba_runs(code, tmp_path)
    assert results["shipped"][0] == "False"  # every call ran from the shipped kernels
    a, b = results["shipped"][1], results["numba"][1]
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.gpu
def test_fresh_process_classifies_from_shipped_kernels_without_numba(tmp_path):
    """The classifier's features, GEMVs, softmax and argmax run from the shipped cubins
    (`kernels.common.refs`) in a process that never imports Numba, with the results of
    the Numba path (every kernel compiled) bit for bit."""
    code = """
        import sys
        import numpy as np
        from imgfilter import classify, io
        img = io.read_image("samples/astronaut.jpg")
        model = classify.load("samples/classify/astronaut.model.npz")
        out = classify.predict(img, model, backend="cuda")
        gray = np.ascontiguousarray(img[::2, ::3, 1])
        feats = classify.extract_features(gray, {"gauss": [1.5], "box": [7, 40], "edges": [2.0],
                                                 "contour": True}, backend="cuda")
        np.savez(sys.argv[1], labels=out.labels, proba=out.proba, feats=feats)
        print("numba" in sys.modules)
        """
    results = _shipped_and_numba_runs(code, tmp_path)
    assert results["shipped"][0] == "False", "the classifier imported Numba"
    assert results["numba"][0] == "True"
    a, b = results["shipped"][1], results["numba"][1]
    for name in ("labels", "proba", "feats"):
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_signature_keys_tell_kernels_apart_and_last_across_processes():
    from numba import types

    from kernels.box import fused as box_fused
    from kernels.conv import generic as conv

    f32, u8 = (types.float32,), (types.uint8,)
    keys = [
        shipped.signature_key(box_fused.kernel_for(np.int32, 3, True), f32),
        shipped.signature_key(box_fused.kernel_for(np.int32, 3, False), f32),
        shipped.signature_key(box_fused.kernel_for(np.int32, 4, True), f32),
        shipped.signature_key(conv.correlate_tiled, f32),
        shipped.signature_key(conv.correlate_tiled, u8),
    ]
    assert all(k and k.startswith("launch-") for k in keys) and len(set(keys)) == len(keys)
    code = (
        "import numpy as np; from numba import types; from kernels.box import fused as box_fused; "
        "from kernels.common import shipped; "
        "print(shipped.signature_key(box_fused.kernel_for(np.int32, 3, True), (types.float32,)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert done.stdout.strip() == keys[0], done.stderr


def test_kernels_outside_the_package_or_generated_have_no_key():
    from numba import cuda, types

    @cuda.jit
    def local(x):
        pass

    assert shipped.signature_key(local, (types.float32,)) is None
    generated = type("D", (), {"py_func": staticmethod(lambda: None)})()
    generated.py_func.__module__ = "kernels.common.launch"
    assert shipped.signature_key(generated, ()) is None


def test_what_the_quick_start_cannot_run_goes_to_the_requests_backend(monkeypatch):
    """With shipped kernels a GPU without the CUDA compiler still gets the quick start;
    anything else goes where the request would have gone without it: auto to the CPU
    (noted once), cuda to a one-line DeviceError."""
    from imgfilter import backends
    from imgfilter.backends import cpu

    monkeypatch.setattr(cached, "_box_quick", lambda *args: None)  # not shipped
    monkeypatch.setattr(backends, "_cuda_problem", lambda: "no CUDA compiler")
    monkeypatch.setattr(cached, "_QUICK", {})
    img = _image_u8()
    auto = cached.for_request("auto", lambda: backends._numba_or_fallback("auto", False))
    got = auto.box(img, (3, 3), (1, 1), 4, 0.0, "auto")
    np.testing.assert_array_equal(got, cpu.box(img, (3, 3), (1, 1), 4, 0.0, "auto"))
    strict = cached.for_request("cuda", lambda: backends._numba_or_fallback("cuda", False))
    with pytest.raises(backends.DeviceError, match="no CUDA compiler"):
        strict.box(img, (3, 3), (1, 1), 4, 0.0, "auto")
    assert strict.NAME == "cuda"


def _image_u8():
    return np.random.default_rng(4).integers(0, 256, (9, 11, 3), dtype=np.uint8)


def test_a_failed_background_compile_is_swallowed_and_its_marker_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    marker = cubins.pending_marker("box_tiled-z")
    marker.parent.mkdir(parents=True)
    marker.write_text("1")
    with background.compiling("box_tiled-z"):
        raise RuntimeError("NVVM failed")
    assert not marker.exists()


def test_the_package_data_ships_every_binary():
    """pyproject.toml's package data names the binaries (a wheel built without them
    would compile every kernel on its first use)."""
    import fnmatch

    from kernels.common import shipped

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    globs = tomllib.loads((shipped.KERNELS_DIR.parent / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["kernels"]  # fmt: skip
    files = sorted(p.name for p in shipped.DIRECTORY.iterdir())
    assert files and all(any(fnmatch.fnmatch(f"prebuilt/{f}", g) for g in globs) for f in files)
