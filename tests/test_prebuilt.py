"""The kernels shipped in the package (issue 24): a first use without compiling.

Without a GPU: the shipped manifest is current (its digests are the sources'), holds
every kernel a first use launches (the size-generic kernels and the stand-ins for the
size-specialised ones, by the launch layer's names), each in a fatbin with a cubin for
every GPU generation it lists, and the folder holds those files only (at most 200);
names last across processes; where kernels ship for the GPU, backend auto takes it
without a CUDA compiler; background compiles start once per kernel. How the shipped
set and the user's cache are looked up is tested in test_binaries, the stand-ins in
test_first_use. On a GPU (`gpu`): a fresh process with an empty cache filters and
classifies from the shipped kernels without importing Numba and gets exactly the
results of a process that compiled every kernel.
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
from types import SimpleNamespace

import numpy as np
import pytest
from test_binaries import no_device_fixture  # noqa: F401 - the fixture no_device

from imgfilter.backends import background
from kernels.box import plan as box_plan
from kernels.common import binaries, launch, shipped

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


def _first_uses(no_device) -> list:
    """[(case, launch function)] of what a first use launches and must find shipped: the
    stand-ins for the size-specialised kernels (box_twopass for uint8 boxes, conv's
    window kernel for filters) and the size-generic kernels (box_fused, box_running,
    contour, conv's tiled and window kernels, including those method auto picks for
    kernels past the blocked kernel's 31x31), on images of every channel count."""
    from imgfilter.backends import cuda as backend
    from kernels.box.dispatch import box_by_name
    from kernels.contour.launch import contour
    from kernels.conv import dispatch as conv

    def box(method, img, ksize):
        return lambda: box_by_name(method)(img, ksize, (ksize[0] // 2, ksize[1] // 2), 4, 0)

    cases = []
    for channels in (1, 3, 4):
        img = no_device.empty((480, 640, channels), np.uint8)
        for ksize in ((3, 3), (21, 21), (31, 5), (1, 31)):
            assert box_plan.twopass_plan(img.shape, img.dtype, ksize) is not None
            cases.append((("twopass", channels, ksize), box("twopass", img, ksize)))
        # Boxes wider than the one-pass kernels take go to box_running, whose kernels
        # ship for the 3x3 and 257x257 boxes of float32 images below; a box that wide
        # on an integer image compiles on its first use.
        boxes = {np.uint16: ((3, 3), (21, 21), (61, 61), (2, 300)),
                 np.uint8: ((3, 301), (1, 301))}  # fmt: skip
        for dtype, ksizes in boxes.items():
            img = no_device.empty((480, 640, channels), dtype)
            cases.append((("contour", channels, dtype), lambda img=img: contour(img, 4, 0)))
            for ksize in ksizes:
                method, _ = box_plan.choose(img.shape, img.dtype, ksize)
                stand_in = box_plan.STAND_IN.get(method)
                if stand_in is not None:  # specialised for the box: compiled (first
                    # behind its stand-in where that takes the image, test_first_use)
                    if not box_plan.stand_in_takes(stand_in, img.shape, img.dtype, ksize, 0):
                        continue
                    method = stand_in
                cases.append(((method, channels, dtype, ksize), box(method, img, ksize)))
        img = no_device.empty((480, 640, channels), np.float32)
        cases += [(("running", channels, "float32", k), box("running", img, k))
                  for k in ((3, 3), (257, 257))]  # fmt: skip
    wanted = [((5, 5), "window", "window"), ((5, 5), "tiled", "tiled"),
              ((41, 41), "auto", "window"), ((64, 64), "auto", "tiled")]  # fmt: skip
    for ksize, asked, method in wanted:
        kernel = np.ones(ksize, np.float32)
        assert backend._prepared(ksize, kernel.tobytes(), asked)[0] == method, (ksize, asked)
        weights = no_device.empty(ksize, np.float32)
        for dtype in (np.uint8, np.uint16, np.float32):
            img = no_device.empty((50, 60, 3), dtype)
            cval = np.dtype(dtype).type(0)
            args = (img, weights, (ksize[0] // 2, ksize[1] // 2), 4, cval, method, None, 0)
            cases.append(((method, dtype, ksize), lambda args=args: conv.correlate(*args)))
    return cases


def test_the_first_use_kernels_ship(no_device):
    """Every kernel a first use launches is in the manifest under its launch name (that
    it is built from these sources is test_shipped_kernels_are_built_from_these_sources's
    to say)."""
    no_device.found.update({name: (b"fatbin", entry["entry"])
                            for name, entry in MANIFEST["kernels"].items()})  # fmt: skip
    missing: dict = {}  # binary name -> (its kernel, the first case that lacks it)
    for case, run in _first_uses(no_device):
        try:
            with launch.checking():
                run()
        except launch.NotCompiled as exc:
            missing.setdefault(exc.name, (exc.kernel, case))
    assert not missing, f"rebuild with `python tools/build_cubins.py` on a GPU machine: {missing}"
    assert no_device.driver.launched == []


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


def test_one_background_compile_per_kernel_until_its_marker_goes_stale(tmp_path, monkeypatch):
    spawned = []
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(background, "ENABLED", True)
    monkeypatch.setattr(background.subprocess, "Popen", lambda argv, **kw: spawned.append(argv))
    assert background.start("box_tiled-x", "pass")
    assert background.start("box_tiled-x", "pass")  # at it already
    assert len(spawned) == 1 and spawned[0][1:] == ["-c", "pass"]
    marker = binaries.pending_marker("box_tiled-x")
    os.utime(marker, (0, 0))  # a compile that died long ago
    assert background.start("box_tiled-x", "pass") and len(spawned) == 2
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", "/proc/imgfilter-no-such-cache")
    assert not background.start("box_tiled-y", "pass")  # nowhere to leave a cubin


def _shipped_and_numba_runs(code: str, tmp_path) -> dict:
    """Run `code` (which saves its results to the .npz named by argv[1] and prints
    whether Numba was imported) in two fresh processes on a GPU with empty kernel
    caches: with the shipped kernels, and without them (every kernel compiled by
    Numba, at once). {run: (its output, its .npz)}."""
    results = {}
    for run, extra in (
        ("shipped", {}),
        ("numba", {"IMGFILTER_NO_PREBUILT": "1", "IMGFILTER_BACKGROUND_COMPILE": "0"}),
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


def test_launch_names_tell_overloads_apart_and_last_across_processes():
    """A binary's name (`shipped.launch_name` of the kernel's ref key and its argument
    types) differs between a factory's kernels and between argument types, and is the
    same in another process."""
    from kernels.contour.launch import contour_kernel
    from kernels.conv.launch import blocked_kernel, correlate_tiled

    u8, f32 = ("array(uint8, 3d, C)",), ("array(float32, 3d, C)",)
    names = [
        shipped.launch_name(blocked_kernel(5, 5).function_key, f32),
        shipped.launch_name(blocked_kernel(5, 7).function_key, f32),
        shipped.launch_name(blocked_kernel(5, 5, wide=True).function_key, f32),
        shipped.launch_name(contour_kernel(1).function_key, u8),
        shipped.launch_name(contour_kernel(3).function_key, u8),
        shipped.launch_name(correlate_tiled.function_key, f32),
        shipped.launch_name(correlate_tiled.function_key, u8),
    ]
    assert all(n.startswith("launch-") for n in names) and len(set(names)) == len(names)
    assert blocked_kernel(np.int64(5), 5) is blocked_kernel(5, 5)  # one ref, one name
    code = (
        "from kernels.common import shipped; from kernels.conv.launch import blocked_kernel; "
        "print(shipped.launch_name(blocked_kernel(5, 5).function_key, "
        "('array(float32, 3d, C)',)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert done.stdout.strip() == names[0], done.stderr


def test_kernels_outside_the_package_or_generated_have_no_name():
    from numba import cuda

    from kernels.common.refs import key_of

    @cuda.jit
    def local(x):
        pass

    assert key_of(local) is None
    generated = type("D", (), {"py_func": staticmethod(lambda: None)})()
    generated.py_func.__module__ = "kernels.common.launch"  # a wrapper the launch layer makes
    assert key_of(generated) is None


def test_kernels_that_ship_need_no_compiler_on_the_gpu(monkeypatch, capsys):
    """Where kernels ship for the GPU, backend auto takes it without the CUDA compiler
    (what needs one compiles at first use); without either, auto goes to the CPU
    (noted once) and cuda is a one-line DeviceError."""
    from imgfilter import backends
    from imgfilter.backends import cpu
    from kernels.common import cudadrv

    cc = [(9, 0)]  # a generation kernels ship for
    assert shipped.ships_for(cc[0])
    monkeypatch.setattr(cudadrv, "driver", lambda: SimpleNamespace(cc=cc[0]))
    monkeypatch.setattr(backends, "_driver_problem", lambda: None)
    monkeypatch.setattr(backends, "compiler_problem", lambda: "no CUDA compiler")
    monkeypatch.setattr(backends, "_warned_fallback", False)
    monkeypatch.setattr(backends, "_device_backend", [])
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM")  # as on a GPU machine (read per call)
    backends._cuda_problem.cache_clear()
    try:
        assert backends.get_backend("auto").NAME == "cuda"
        assert backends.get_backend("cuda").NAME == "cuda"
        cc[0] = (6, 1)  # none ships for it
        backends._cuda_problem.cache_clear()
        assert backends.get_backend("auto") is cpu
        assert "no CUDA compiler; using the CPU backend" in capsys.readouterr().err
        with pytest.raises(backends.DeviceError, match="no CUDA compiler"):
            backends.get_backend("cuda")
    finally:
        backends._cuda_problem.cache_clear()


def test_a_failed_background_compile_is_swallowed_and_its_marker_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    marker = binaries.pending_marker("box_tiled-z")
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
