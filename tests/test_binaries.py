"""Kernel binaries by name (`kernels.common.binaries`) and the launch layer's use of them.

Without a GPU: a kernel's binary comes from the shipped set where one ships for the GPU
and these sources, else from the user's cache; the cache keeps what `remember` exports
(beside a sidecar naming its entry point, closure and digest) and ignores stale,
broken or foreign files; IMGFILTER_NO_PREBUILT=1 leaves the cache alone. Under
`launch.checking()` a launch queues nothing and raises NotCompiled, naming the binary,
where its kernel would have to be compiled. What Numba compiles is exported and found
by name afterwards, the var-shape kernels of image lists too. The fixture `no_device`
(`no_device_fixture`, imported by test_first_use, test_prebuilt, test_batch and
test_bench) runs launch functions as on a GPU without touching one.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import shutil
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from kernels.common import arrays, binaries, devarray, launch, shipped
from kernels.common.devarray import DeviceArray
from kernels.common.refs import KernelRef

CC = (9, 0)
_REAL_LOAD = binaries.load
# A name as the launch layer makes them (`shipped.launch_name`).
NAME = shipped.launch_name("kernels.contour.kernel|_make_contour_fused|(1,)", ("int64",))


class _FakeDriver:
    """The driver as the launch layer uses it, without a GPU: modules load as handles
    (noted in `loaded`); launches are noted in `launched`."""

    cc = CC

    def __init__(self) -> None:
        self.loaded: list = []
        self.launched: list = []
        self.handles = itertools.count(100)

    def function(self, image: bytes, entry: str) -> int:
        self.loaded.append((image, entry))
        return next(self.handles)

    def launch(self, handle, grid, block, smem, stream, packer, values) -> None:
        self.launched.append((handle, grid, block))


@pytest.fixture(name="no_device")
def no_device_fixture(monkeypatch):
    """Launch functions run as on a GPU, without one: device arrays are DeviceArrays at
    made-up addresses (nothing is allocated, uploaded or launched on a device), the
    binaries are those in `found` ({name: (image, entry)}; `binaries.load` is
    replaced), and `driver` (a `_FakeDriver`) notes what loads and launches."""
    for module in ("kernels.common.var_shape", "kernels.common.timing", "imgfilter.streamed"):
        importlib.import_module(module)  # they copy the flags patched here when imported
    addresses = itertools.count(1 << 32, 1 << 28)

    def empty(shape, dtype, stream=0):
        return DeviceArray(next(addresses), tuple(shape), dtype)

    found: dict = {}
    drv = _FakeDriver()
    monkeypatch.setattr(arrays, "SIMULATOR", False)
    monkeypatch.setattr(launch, "SIMULATOR", False)
    monkeypatch.setattr(devarray, "empty", empty)
    monkeypatch.setattr(devarray, "to_device", lambda host, stream=0: empty(host.shape, host.dtype))
    monkeypatch.setattr(launch, "_compiled", {})
    monkeypatch.setattr(launch, "driver", lambda: drv)
    monkeypatch.setattr(binaries, "load", lambda name, cc: found.get(name))

    def no_compile(*args, **kwargs):
        raise AssertionError("a kernel was compiled")

    monkeypatch.setattr(launch, "dispatcher_of", no_compile)
    return SimpleNamespace(found=found, driver=drv, empty=empty)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty user cache in tmp_path, no kernel shipped, nothing remembered yet."""
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(binaries, "_saved", set())
    monkeypatch.setattr(shipped, "manifest", lambda: {})
    return tmp_path / "cubins"


def _write_manifest(folder, digest: str, entry="_Zcontour") -> None:
    manifest = {
        "archs": ["sm90"],
        "kernels": {NAME: {"entry": entry, "modules": ["contour.kernel"], "digest": digest}},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    shipped.manifest.cache_clear()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A shipped folder in tmp_path with one contour kernel for sm_90 (`NAME`), and an
    empty user cache."""
    folder = tmp_path / "prebuilt"
    folder.mkdir()
    (folder / f"{NAME}{shipped.SUFFIX}").write_bytes(b"shipped")
    monkeypatch.setattr(shipped, "DIRECTORY", folder)
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("IMGFILTER_NO_PREBUILT", raising=False)
    monkeypatch.setattr(binaries, "_saved", set())
    _write_manifest(folder, shipped.sources_digest(("contour.kernel",)))
    yield folder
    shipped.manifest.cache_clear()


def _clear_digests():
    shipped.files_digest.cache_clear()
    shipped._imports.cache_clear()


# ------------------------------------------------------------------ shipped, else cached


def test_shipped_kernels_serve_the_generations_they_list_only(folder):
    assert binaries.load(NAME, CC) == (b"shipped", "_Zcontour")
    assert binaries.load(NAME, (8, 0)) is None
    assert binaries.load(NAME + "x", CC) is None
    assert not binaries.any_cached()  # shipped kernels are not the user's cache


def test_the_shipped_kernel_comes_first_and_the_cache_fills_in(folder):
    """A kernel that ships (built from these sources) is loaded from the package even
    where the user's cache holds one; the cache serves where none ships for these
    sources."""
    _write_manifest(folder, "0" * 16)  # built from other sources: the cache takes it
    binaries.remember(NAME, CC, lambda: (b"cached", "_Zcached"), ("contour.kernel",))
    assert binaries.any_cached()
    assert binaries.load(NAME, CC) == (b"cached", "_Zcached")
    _write_manifest(folder, shipped.sources_digest(("contour.kernel",)))
    assert binaries.load(NAME, CC) == (b"shipped", "_Zcontour")


def test_a_kernel_that_ships_is_not_cached_again(folder):
    binaries.remember(NAME, CC, lambda: pytest.fail("exported"), ("contour.kernel",))
    assert not binaries.any_cached()
    binaries.remember("launch-other", CC, lambda: (b"img", "_Zb"), ("contour.kernel",))
    assert binaries.load("launch-other", CC) == (b"img", "_Zb")  # not shipped: cached


def test_stale_broken_or_switched_off_shipped_kernels_are_ignored(folder, monkeypatch):
    _write_manifest(folder, "0" * 16)  # built from other sources
    assert binaries.load(NAME, CC) is None
    _write_manifest(folder, shipped.sources_digest(("contour.kernel",)), entry=3)
    assert binaries.load(NAME, CC) is None
    (folder / "manifest.json").write_text("{broken")
    shipped.manifest.cache_clear()
    assert binaries.load(NAME, CC) is None and not shipped.ships_for(CC)
    _write_manifest(folder, shipped.sources_digest(("contour.kernel",)))
    monkeypatch.setenv("IMGFILTER_NO_PREBUILT", "1")
    shipped.manifest.cache_clear()
    assert shipped.manifest() == {} and binaries.load(NAME, CC) is None
    # The user's cache still serves: only the shipped set is switched off.
    binaries.remember(NAME, CC, lambda: (b"cached", "_Zc"), ("contour.kernel",))
    assert binaries.load(NAME, CC) == (b"cached", "_Zc")


def test_a_shipped_kernel_is_found_without_a_cache_digest(monkeypatch):
    monkeypatch.setattr(shipped, "load", lambda name, cc: (b"shipped", "_Z"))

    def no_digest(*args):
        raise AssertionError("digest computed")

    monkeypatch.setattr(binaries, "_digest", no_digest)
    assert binaries.load(NAME, CC) == (b"shipped", "_Z")


# ------------------------------------------------------------------------ the user's cache


def test_the_cache_keeps_what_is_remembered_once_with_its_sidecar(cache):
    assert binaries.load(NAME, CC) is None and not binaries.any_cached()
    binaries.remember(NAME, CC, lambda: (b"\x7fELF...", "_Z7contour"), ("contour.kernel",))
    assert binaries.load(NAME, CC) == (b"\x7fELF...", "_Z7contour")
    assert binaries.load(NAME, (8, 0)) is None  # another GPU generation
    assert binaries.any_cached()
    meta = json.loads((cache / f"{NAME}-sm90.json").read_text())
    closure = shipped.closure(("contour.kernel",))
    assert meta == {"entry": "_Z7contour", "closure": closure,
                    "digest": binaries._digest(tuple(closure))}  # fmt: skip
    assert "border_index" in " ".join(closure)  # the modules contour.kernel imports
    # Once per process and generation: a second export of the name writes nothing.
    binaries.remember(NAME, CC, lambda: pytest.fail("exported twice"), ("contour.kernel",))
    assert sorted(p.name for p in cache.iterdir()) == [f"{NAME}-sm90.cubin", f"{NAME}-sm90.json"]
    assert binaries.pending_marker(NAME) == cache / f"{NAME}.pending"


def test_broken_or_foreign_cache_files_are_ignored(cache):
    binaries.remember(NAME, CC, lambda: (b"img", "_Zc"), ("contour.kernel",))
    meta_path = cache / f"{NAME}-sm90.json"
    meta = json.loads(meta_path.read_text())
    for broken in ("{not json", json.dumps({**meta, "entry": 3}),
                   json.dumps({k: v for k, v in meta.items() if k != "digest"}),
                   json.dumps({**meta, "closure": 5}), json.dumps([1, 2])):  # fmt: skip
        meta_path.write_text(broken)
        assert binaries.load(NAME, CC) is None, broken
    meta_path.write_text(json.dumps(meta))
    assert binaries.load(NAME, CC) == (b"img", "_Zc")
    (cache / f"{NAME}-sm90.cubin").write_bytes(b"")  # an empty image
    assert binaries.load(NAME, CC) is None
    (cache / f"{NAME}-sm90.cubin").unlink()  # a sidecar alone
    assert binaries.load(NAME, CC) is None
    (cache / "launch-alone-sm90.cubin").write_bytes(b"img")  # a binary without its sidecar
    assert binaries.load("launch-alone", CC) is None


def test_a_binary_from_other_sources_or_another_numba_is_not_used(cache, tmp_path, monkeypatch):
    """The sidecar's digest covers the sources of every module in the kernel's closure
    and the numba-cuda version: an edited module, a module gone, a closure edited or
    another numba-cuda each make the binary stale (compiled again)."""
    import kernels

    copy = tmp_path / "kernels"
    shutil.copytree(os.path.dirname(kernels.__file__), copy)
    monkeypatch.setattr(shipped, "_kernels_dir", lambda: copy)
    _clear_digests()
    try:
        binaries.remember(NAME, CC, lambda: (b"img", "_Zc"), ("contour.kernel",))
        assert binaries.load(NAME, CC) == (b"img", "_Zc")
        launch_py = copy / "common" / "launch.py"  # a host module: not in the closure
        launch_py.write_text(launch_py.read_text() + "\n# host\n")
        _clear_digests()
        assert binaries.load(NAME, CC) == (b"img", "_Zc")
        version = binaries._numba_cuda_version
        monkeypatch.setattr(binaries, "_numba_cuda_version", lambda: "0.0-other")
        assert binaries.load(NAME, CC) is None
        monkeypatch.setattr(binaries, "_numba_cuda_version", version)
        assert binaries.load(NAME, CC) == (b"img", "_Zc")
        meta_path = cache / f"{NAME}-sm90.json"
        meta = json.loads(meta_path.read_text())
        meta_path.write_text(json.dumps({**meta, "closure": ["contour.kernel"]}))
        assert binaries.load(NAME, CC) is None  # a closure that leaves modules out
        meta_path.write_text(json.dumps(meta))
        border = copy / "common" / "border_index.py"  # in contour's closure
        border.write_text(border.read_text() + "\n#\n")
        _clear_digests()
        assert binaries.load(NAME, CC) is None
        border.unlink()
        _clear_digests()
        assert binaries.load(NAME, CC) is None  # a module the compile saw is gone
    finally:
        _clear_digests()


def test_a_later_process_finds_a_cached_binary_without_parsing_sources(cache, monkeypatch):
    """The sidecar holds the closure: a later process hashes those sources and parses
    none of them."""
    binaries.remember(NAME, CC, lambda: (b"img", "_Zc"), ("contour.kernel",))
    _clear_digests()  # as in a new process

    def no_parsing(*args, **kwargs):
        raise AssertionError("sources parsed")

    monkeypatch.setattr(shipped, "closure", no_parsing)
    monkeypatch.setattr(shipped.ast, "parse", no_parsing)
    try:
        assert binaries.load(NAME, CC) == (b"img", "_Zc")
    finally:
        _clear_digests()


def test_remember_never_raises_and_says_why_when_asked(cache, monkeypatch, capsys):
    def failing():
        raise AttributeError("Numba moved its cubins")

    binaries.remember(NAME, CC, failing, ("contour.kernel",))
    assert binaries.load(NAME, CC) is None and not binaries.any_cached()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("IMGFILTER_DEBUG_CUBINS", "1")
    binaries.remember(NAME, (8, 0), failing, ("contour.kernel",))
    assert "Numba moved its cubins" in capsys.readouterr().err
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", "/proc/imgfilter-no-such-cache")  # unwritable
    binaries.remember("launch-x", CC, lambda: (b"img", "_Z"), ("contour.kernel",))
    assert binaries.load("launch-x", CC) is None and not binaries.any_cached()
    binaries.remember("launch-y", CC, lambda: (b"img", "_Z"), ("no_such_module",))
    assert binaries.load("launch-y", CC) is None


# ------------------------------------------------------------ the launch layer's look-up

_NAIVE = KernelRef("kernels.conv.generic", "correlate_naive")


def _naive_args(no_device) -> tuple:
    img, out = no_device.empty((6, 8, 3), np.uint8), no_device.empty((6, 8, 3), np.uint8)
    weights = no_device.empty((3, 3), np.float32)
    return (img, weights, 1, 1, 4, np.uint8(0), 0.0, 255.0, True, out)


def test_checking_names_the_binary_a_launch_lacks_and_launches_nothing(no_device):
    args = _naive_args(no_device)
    want = shipped.launch_name(_NAIVE.function_key, tuple(launch.type_name(a) for a in args))
    with launch.checking(), pytest.raises(launch.NotCompiled) as caught:
        launch.launch(_NAIVE, (1, 1, 3), (32, 8, 1), args)
    assert caught.value.kernel is _NAIVE and caught.value.name == want
    assert no_device.driver.launched == [] and _NAIVE._dispatcher is None  # no Numba asked
    # The binary appears (a background compile kept it): found, loaded once, and queued
    # nothing; the launch after it runs that binary.
    no_device.found[want] = (b"image", "_Zcorrelate_naive")
    for _ in range(2):
        with launch.checking():
            launch.launch(_NAIVE, (1, 1, 3), (32, 8, 1), args)
    assert no_device.driver.loaded == [(b"image", "_Zcorrelate_naive")]
    assert no_device.driver.launched == []
    launch.launch(_NAIVE, (1, 1, 3), (32, 8, 1), args)
    assert [grid for _, grid, _ in no_device.driver.launched] == [(1, 1, 3)]
    assert len(no_device.driver.loaded) == 1


def test_an_argument_without_a_type_name_is_not_compiled_and_has_no_name(no_device):
    args = (*_naive_args(no_device)[:2], 2**63, *_naive_args(no_device)[3:])
    with launch.checking(), pytest.raises(launch.NotCompiled) as caught:
        launch.launch(_NAIVE, 1, 1, args)
    assert caught.value.name is None and no_device.driver.launched == []


def test_checking_is_per_thread_and_nests(no_device):
    args = _naive_args(no_device)
    name = launch._name(_NAIVE, args)
    no_device.found[name] = (b"image", "_Z")
    elsewhere = []

    def other_thread():
        launch.launch(_NAIVE, 1, 1, args)  # not checking: launched
        elsewhere.append(len(no_device.driver.launched))

    with launch.checking():
        with launch.checking():
            launch.launch(_NAIVE, 1, 1, args)
        launch.launch(_NAIVE, 1, 1, args)  # still checking after the inner one ends
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert elsewhere == [1] and len(no_device.driver.launched) == 1
    launch.launch(_NAIVE, 1, 1, args)
    assert len(no_device.driver.launched) == 2


def test_the_simulator_checks_nothing_and_runs_nothing():
    """On the simulator nothing is compiled ahead (no binaries): checking raises
    nothing and queues nothing."""
    from numba import cuda

    from kernels.contour.launch import contour

    if not launch.SIMULATOR:
        pytest.skip("the simulator's behaviour")
    img = cuda.to_device(np.arange(60, dtype=np.uint8).reshape(4, 5, 3))
    out = cuda.to_device(np.full((4, 5), 7, np.uint8))
    with launch.checking():
        contour(img, 4, 0, out)
    assert (out.copy_to_host() == 7).all()
    contour(img, 4, 0, out)
    assert not (out.copy_to_host() == 7).all()


def test_what_numba_compiles_is_exported_and_found_by_name_later(no_device, cache, monkeypatch):
    """A kernel without a binary is compiled through its dispatcher, exported to the
    cache under its launch name with its module's closure, and a later process's look
    finds it there (loaded, not compiled)."""
    from numba import types

    monkeypatch.setattr(binaries, "load", _REAL_LOAD)  # the cache in tmp_path
    args = _naive_args(no_device)
    library = SimpleNamespace(
        get_cufunc=lambda: SimpleNamespace(handle=SimpleNamespace(value=55)),
        get_cubin=lambda cc: b"\x7fELF-naive", _entry_name="_Zcorrelate_naive")  # fmt: skip
    argtypes = [types.Array(types.uint8, 3, "C"), types.Array(types.float32, 2, "C"),
                types.int64, types.int64, types.int64, types.uint8, types.float64,
                types.float64, types.boolean, types.Array(types.uint8, 3, "C")]  # fmt: skip
    compiled = SimpleNamespace(debug=False, cooperative=False, _codelibrary=library,
                               argument_types=argtypes)  # fmt: skip
    compiles = []
    dispatcher = SimpleNamespace(compile=lambda sig: compiles.append(sig) or compiled,
                                 typeof_pyval=_typeof)  # fmt: skip
    monkeypatch.setattr(launch, "dispatcher_of", lambda kernel: dispatcher)
    launch.launch(_NAIVE, 1, 1, args)
    assert len(compiles) == 1 and no_device.driver.loaded == []
    assert [handle for handle, _, _ in no_device.driver.launched] == [55]
    name = launch._name(_NAIVE, args)
    meta = json.loads((cache / f"{name}-sm90.json").read_text())
    assert meta["entry"] == "_Zcorrelate_naive"
    assert meta["closure"] == shipped.closure(("conv.generic",))
    # A later process: nothing loaded yet, the dispatcher not asked.
    monkeypatch.setattr(launch, "_compiled", {})
    monkeypatch.setattr(launch, "dispatcher_of", lambda kernel: pytest.fail("compiled"))
    with launch.checking():
        launch.launch(_NAIVE, 1, 1, args)
    assert no_device.driver.loaded == [(b"\x7fELF-naive", "_Zcorrelate_naive")]


def _typeof(value):
    from numba import typeof

    return typeof(value)


# ------------------------------------------------------------- var-shape kernels (lists)


def _var_shape_case():
    """A module-level kernel (conv's pad_image), and arguments of its var-shape form for
    _PAD_KINDS: the table, then an address space for each per-image array (the image
    and the padded image), the others as they are."""
    kernel = KernelRef("kernels.conv.generic", "pad_image").dispatcher
    args = (DeviceArray(1 << 20, (2, 10), np.int64), DeviceArray(1 << 22, (999,), np.uint8),
            1, 1, 4, np.uint8(0), DeviceArray(1 << 24, (999,), np.uint8))  # fmt: skip
    return kernel, args


_PAD_KINDS = (("array", 3), ("shared",), ("shared",), ("shared",), ("shared",), ("array", 3))


def test_var_shape_kernels_are_kept_in_the_kernel_cache_once_compiled(no_device, monkeypatch):
    """A var-shape kernel is compiled once per process under a name that is the same in
    every process, its binary checked against every `kernels` module (generated source
    has no module of its own); a process that finds the binary loads it instead of
    compiling."""
    from kernels.common import launch, shipped, var_shape

    kernel, args = _var_shape_case()
    compiled = []
    real_compile = var_shape._compile
    monkeypatch.setattr(var_shape, "SIMULATOR", False)
    monkeypatch.setattr(var_shape, "_compiled", {})
    monkeypatch.setattr(var_shape, "_compile",
                        lambda *call: compiled.append((call[0], *call[2:])) or 1)  # fmt: skip
    found = var_shape._loaded(kernel, _PAD_KINDS, args)
    name = var_shape.cubin_name(found, args)
    assert name.startswith("var_shape-")
    assert compiled == [(found, name, shipped.all_modules())]
    assert var_shape._loaded(kernel, _PAD_KINDS, args) is found and len(compiled) == 1
    # A later process, the binary in the cache: loaded by that name, not compiled.
    monkeypatch.setattr(var_shape, "_compiled", {})
    monkeypatch.setattr(var_shape, "_compile", real_compile)
    no_device.found[name] = (b"cubin", "_Zvar_shape")
    assert var_shape._loaded(kernel, _PAD_KINDS, args) is found
    assert no_device.driver.loaded == [(b"cubin", "_Zvar_shape")]
    ((key, loaded),) = var_shape._compiled.items()
    assert key[0] is found and not loaded.library_kernel and launch._compiled == {}
    other = var_shape.var_shape_kernel(kernel, (*_PAD_KINDS[:-1], ("shared",)))
    assert var_shape.cubin_name(other, args) not in (None, name)
    assert var_shape.cubin_name(found, (*args[:3], (1, 2), *args[4:])) is None  # a tuple argument


def test_var_shape_kernels_with_per_image_ints_are_named():
    """`var_shape._kinds` gives a per-image Python int the kind ("int", int): such a
    kernel needs a name too, or it is compiled again in every process."""
    from kernels.common import var_shape

    kinds = (("array", 3), ("int", int), ("int", np.int32), ("shared",), ("shared",), ("array", 3))
    kernel, args = _var_shape_case()
    found = var_shape.var_shape_kernel(kernel, kinds)
    assert var_shape.cubin_name(found, args).startswith("var_shape-")
