"""The quick start: cubins exported by the CUDA backend, launched later without Numba.

Without a GPU: the planning modules and the driver client import no Numba, the kernel
parameters are laid out as Numba lays them out, and the cubin store round-trips and
ignores what it cannot use. On a GPU (`gpu`): a second process filters from the
cached cubins without importing Numba and gets exactly what the Numba path gave.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from imgfilter.backends import cubins
from kernels.common.cudadrv import array_params, scalar_param

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHONPATH = os.environ.get("PYTHONPATH", "")


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
            **env,
        },
        timeout=600,
    )


def test_quick_start_modules_import_no_numba():
    done = _python(
        """
        import sys
        import imgfilter.backends.cached, kernels.box.plan, kernels.contour.plan
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "llvmlite")))
        """,
        {},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_command_line_starts_before_numpy_and_only_for_gpu_commands(tmp_path, monkeypatch):
    from imgfilter.backends import warmup

    done = _python("import sys, imgfilter.__main__; print('numpy' in sys.modules)", {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"  # the context can start before NumPy loads
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.delenv("IMGFILTER_NO_QUICK_START", raising=False)
    monkeypatch.setattr(warmup, "PREBUILT_MANIFEST", tmp_path / "none.json")
    assert not warmup.wanted(["blur", "in.jpg", "--k", "21"])  # no cubins cached or shipped
    (tmp_path / "cubins").mkdir()
    (tmp_path / "cubins" / "box_packed-c3-r30-t64-e0-abc-sm90.cubin").write_bytes(b"x")
    assert warmup.wanted(["blur", "in.jpg", "--k", "21", "--backend", "cuda"])
    # auto may run one blur on the CPU: the CLI starts it once it knows (start_for)
    assert not warmup.wanted(["blur", "in.jpg", "--k", "21"])
    assert warmup._wanted("blur", "auto") and not warmup._wanted("blur", "cpu")
    assert warmup.wanted(["--debug", "filter", "in.jpg", "--kernel", "k.npy"])
    assert warmup.wanted(["contour", "in.jpg", "--backend", "cuda"])
    assert not warmup.wanted(["blur", "in.jpg", "--backend", "cpu"])
    assert not warmup.wanted(["blur", "in.jpg", "--backend=CPU"])
    assert not warmup.wanted(["blur", "--help"])
    assert not warmup.wanted(["compare", "in.jpg", "--k", "3"])
    assert not warmup.wanted([])
    monkeypatch.setenv("IMGFILTER_NO_QUICK_START", "1")
    assert not warmup.wanted(["blur", "in.jpg"])


def test_the_cpu_limit_of_a_blur_grows_with_the_cpus(tmp_path, monkeypatch):
    """A blur (banded over the CPUs) goes to the CPU up to BLUR_ON_CPU_BYTES_PER_CPU per
    CPU, never less than ONE_IMAGE_ON_CPU_BYTES; a contour up to that constant."""
    import cv2

    from imgfilter.backends import warmup

    for cpus, blur in ((1, 1 << 27), (2, 1 << 27), (3, 120 << 20), (16, 640 << 20)):
        monkeypatch.setattr(warmup, "_cpus", lambda cpus=cpus: cpus)
        assert warmup.cpu_limit("blur") == max(blur, 1 << 27), cpus
        assert warmup.cpu_limit("contour") == 1 << 27
    # 64x60x3 pixels in a small file: within the blur's limit on 16 CPUs only.
    flat = tmp_path / "flat.png"
    cv2.imwrite(str(flat), np.full((64, 60, 3), 9, np.uint8))
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", 64 * 60 * 3 - 1)
    monkeypatch.setattr(warmup, "BLUR_ON_CPU_BYTES_PER_CPU", 64 * 60 * 3 // 16)
    assert warmup.one_image_on_cpu(flat, "blur") and not warmup.one_image_on_cpu(flat, "contour")
    monkeypatch.setattr(warmup, "_cpus", lambda: 15)
    assert not warmup.one_image_on_cpu(flat, "blur")


def test_auto_blur_of_an_image_past_the_cpu_limit_opens_the_gpu_at_start(tmp_path, monkeypatch):
    """--backend auto, blur and contour: the context starts with the process when the input's file
    or its header's pixels pass warmup.cpu_limit(command), for a folder (several images)
    and with --method; otherwise the CLI decides later (`start_for`)."""
    import cv2

    from imgfilter.backends import warmup

    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.delenv("IMGFILTER_NO_QUICK_START", raising=False)
    (tmp_path / "cubins").mkdir()
    (tmp_path / "cubins" / "box_packed-c3-r30-t64-e0-abc-sm90.cubin").write_bytes(b"x")
    flat = tmp_path / "flat.png"  # 40x60x3 pixels in a file of a few hundred bytes
    cv2.imwrite(str(flat), np.full((40, 60, 3), 9, np.uint8))
    pixels = 40 * 60 * 3
    assert flat.stat().st_size < pixels - 1
    blur = ["blur", str(flat), "--k", "3"]
    monkeypatch.setattr(warmup, "BLUR_ON_CPU_BYTES_PER_CPU", 0)  # the limit: the constant
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", pixels)
    assert warmup.one_image_on_cpu(flat, "blur") and not warmup.wanted(blur)
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", pixels - 1)  # the header says more
    assert not warmup.one_image_on_cpu(flat, "blur") and warmup.wanted(blur)
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", flat.stat().st_size - 1)  # the file
    assert warmup.wanted(blur)
    monkeypatch.setattr(warmup, "ONE_IMAGE_ON_CPU_BYTES", 1 << 27)
    assert not warmup.wanted(blur)
    assert not warmup.wanted(["contour", str(flat)])  # contour too
    assert warmup.wanted(["filter", str(flat), "--kernel", "1,2,1"])  # not filter
    assert warmup.wanted([*blur, "--method", "tiled"]) and warmup.wanted([*blur, "--method=tiled"])
    assert not warmup.wanted([*blur, "--method", "auto"])
    assert warmup.wanted(["blur", str(tmp_path), "--k", "3"])  # a folder: several images
    assert not warmup.one_image_on_cpu(tmp_path, "blur")
    assert not warmup.wanted(["blur", "--k", "3", str(flat)])  # input not first: the CLI decides
    assert not warmup.wanted(["blur", str(tmp_path / "*.png"), "--k", "3"])  # a pattern: same
    missing = tmp_path / "missing.png"
    assert warmup.one_image_on_cpu(missing, "contour")  # its read will say what is wrong
    # Decided before NumPy is imported (the context thread starts first thing).
    code = f"import sys; from imgfilter.backends import warmup; warmup.wanted({blur!r}); "
    done = _python(code + "print('numpy' in sys.modules)", {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_classify_and_train_open_the_gpu_early_whatever_is_cached(tmp_path, monkeypatch):
    """They import Numba's CUDA target, which takes longer than making the context:
    the context is made meanwhile, with or without cached kernels."""
    from imgfilter.backends import warmup

    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setenv("IMGFILTER_NO_QUICK_START", "1")
    monkeypatch.setattr(warmup, "PREBUILT_MANIFEST", tmp_path / "none.json")
    assert warmup.wanted(["classify", "in.jpg", "-m", "model.npz"])
    assert warmup.wanted(["train", "in.jpg", "labels.png", "--backend", "cuda"])
    assert not warmup.wanted(["classify", "in.jpg", "-m", "m.npz", "--backend", "cpu"])
    assert not warmup.wanted(["train", "--help"])
    assert not warmup.wanted(["blur", "in.jpg", "--k", "3"])  # no cubins: Numba compiles
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert not warmup.wanted(["classify", "in.jpg", "-m", "model.npz"])


def test_quick_box_looks_for_the_cubin_of_the_kernel_box_auto_runs(monkeypatch):
    from imgfilter.backends import cached
    from kernels.box import plan as box_plan

    names = {
        "tiled": lambda geo, dtype, ksize: cubins.tiled_name(geo, 3, ksize),
        "fused": lambda geo, dtype, ksize: cubins.box_name(geo, 3, dtype),
        "packed": lambda geo, dtype, ksize: cubins.packed_name(geo, 3),
        "twopass": lambda geo, dtype, ksize: cubins.twopass_names(3, geo)[0],
    }
    asked, methods = [], []
    monkeypatch.setattr(cached, "_run", lambda name, *args, **kw: asked.append(name))
    monkeypatch.setattr(cached.background, "compile_box", lambda *args: False)
    cases = [(np.uint8, (21, 21)), (np.uint16, (5, 5)), (np.uint8, (200, 3)), (np.uint8, (3, 45))]
    for dtype, ksize in cases:
        img = np.zeros((40, 50, 3), dtype)
        cached._box_quick(img, ksize, (ksize[0] // 2, ksize[1] // 2), 0, 0)
        method, geo = box_plan.choose(img.shape, img.dtype, ksize)
        assert asked[-1] == names[method](geo, dtype, ksize)
        methods.append(method)
    assert methods == ["tiled", "fused", "twopass", "twopass"]
    assert asked[0].startswith("box_tiled-c3")  # box_tiled: uint8 boxes up to TILED_MAX_BOX


def test_quick_results_go_straight_into_a_fitting_out(monkeypatch):
    from imgfilter.backends import cached

    targets = []

    def quick(img, *args):
        target = cached._caller_out(img.shape, img.dtype, np.ndarray)
        targets.append(target)
        result = np.empty_like(img) if target is None else target
        result[...] = 7
        return result

    monkeypatch.setattr(cached, "_box_quick", quick)
    img = np.ones((4, 5, 3), np.uint8)
    out = np.zeros_like(img)
    assert cached.box(img, (3, 3), (1, 1), 0, 0, "auto", out) is out
    assert targets[-1] is out and (out == 7).all()
    strided = np.zeros((4, 10, 3), np.uint8)[:, ::2]  # not contiguous: filled by a copy
    assert cached.box(img, (3, 3), (1, 1), 0, 0, "auto", strided) is strided
    assert targets[-1] is None and (strided == 7).all()
    other = np.zeros((4, 5, 3), np.uint16)  # another dtype: not a target either
    cached.box(img, (3, 3), (1, 1), 0, 0, "auto", other)
    assert targets[-1] is None
    assert cached._caller_out(img.shape, img.dtype, np.ndarray) is None  # cleared after each call


@pytest.mark.parametrize("fails", [False, True])
def test_background_context_is_what_the_quick_start_uses(tmp_path, monkeypatch, fails):
    import threading

    from imgfilter.backends import cached, warmup
    from kernels.common import cudadrv

    opened = []

    class FakeDriver:
        cc = (9, 0)

        def __init__(self):
            if fails:
                raise cudadrv.CudaError("cuInit failed: CUDA_ERROR_NO_DEVICE")
            opened.append(threading.current_thread().name)
            self.current_on = []

        def current(self):
            self.current_on.append(threading.current_thread().name)

    monkeypatch.setattr(cudadrv, "driver", FakeDriver)
    monkeypatch.setattr(warmup, "_thread", None)
    monkeypatch.setattr(warmup, "_result", [])
    monkeypatch.setattr(warmup, "wanted", lambda argv: True)
    cached._driver.cache_clear()
    try:
        assert warmup.start(["blur", "in.jpg"])
        drv = cached._driver()
        if fails:
            assert drv is None and not cached.available()
        else:  # opened on the background thread, then bound to this one
            assert opened == ["imgfilter-cuda-init"]
            assert drv.current_on == [threading.current_thread().name]
    finally:
        cached._driver.cache_clear()


def test_array_params_follow_numbas_layout():
    # meminfo, parent, nitems, itemsize, data, shape..., strides (bytes)...
    params = array_params(0x1000, (2, 3, 4), np.uint16)
    assert [v for _, v in params] == [0, 0, 24, 2, 0x1000, 2, 3, 4, 24, 8, 2]
    assert "".join(code for code, _ in params) == "q" * 11


def test_scalar_params_are_typed_as_numba_types_them():
    assert scalar_param(7) == ("q", 7)
    assert scalar_param(np.int64(-3)) == ("q", -3)
    assert scalar_param(np.float32(0.5)) == ("f", 0.5)
    assert scalar_param(0.5) == ("d", 0.5)
    assert scalar_param(True) == ("?", True)
    assert scalar_param(np.uint8(200)) == ("B", 200)
    assert scalar_param(np.uint16(65535)) == ("H", 65535)
    assert scalar_param(np.int32(-7)) == ("i", -7)
    with pytest.raises(TypeError, match="unsupported"):
        scalar_param("3")


def test_parameters_are_packed_at_their_c_offsets():
    """launch_params lays (code, value) pairs out as a C struct (the CUDA ABI): a
    uint8 then an int64 puts the int64 at offset 8."""

    from cuda.bindings import driver as bindings

    from kernels.common import cudadrv

    seen = []

    class Bindings:
        CUlaunchConfig = bindings.CUlaunchConfig

        def cuCtxSetCurrent(self, context):
            return (0,)

        def cuLaunchKernelEx(self, config, fn, params, extra_address):
            extra = (ctypes.c_void_p * 5).from_address(extra_address)
            size = ctypes.c_size_t.from_address(extra[3]).value
            seen.append((ctypes.string_at(extra[1], size), config.gridDimX, config.gridDimY))
            return (0,)

    drv = object.__new__(cudadrv.Driver)
    drv._cu, drv.context, drv._tls, drv._smem_opted = (
        Bindings(),
        None,
        cudadrv._ThreadState(),
        set(),
    )
    params = [scalar_param(np.uint8(3)), *array_params(0x2000, (5,), np.float32)]
    drv.launch_params(7, (4,), (32,), 0, 0, params)
    ((packed, gx, gy),) = seen
    assert len(packed) == 8 + 7 * 8 and packed[0] == 3 and (gx, gy) == (4, 1)
    assert int.from_bytes(packed[8 + 4 * 8 : 8 + 5 * 8], "little") == 0x2000  # data pointer


class _ArrayType:
    """Stands in for a Numba array type in a signature: only its dtype is read."""

    def __init__(self, dtype: str):
        self.dtype = dtype


def _fake_dispatcher(dtype: str, image: bytes, entry: str):
    """The attributes `cubins.remember` reads from a compiled Numba dispatcher."""
    library = SimpleNamespace(get_cubin=lambda cc: image, _entry_name=entry)
    signature = (_ArrayType(dtype), "int64")
    return SimpleNamespace(overloads={signature: SimpleNamespace(_codelibrary=library)})


def test_cubin_store_round_trip_and_refusals(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cubins, "_saved", set())
    monkeypatch.setattr(cubins.shipped, "manifest", lambda: {})  # the user's cache alone
    assert cubins.load("contour-uint8-c1", (9, 0)) is None
    assert not cubins.any_for((9, 0))
    fake = _fake_dispatcher("uint8", b"\x7fELF...", "_Z7contour")
    cubins.remember(fake, "contour-uint8-c1", (np.uint8,), (9, 0))
    assert cubins.load("contour-uint8-c1", (9, 0)) == (b"\x7fELF...", "_Z7contour")
    assert cubins.any_for((9, 0)) and not cubins.any_for((8, 0))
    assert cubins.load("contour-uint8-c1", (8, 0)) is None  # another GPU generation
    # No specialisation for this dtype: nothing is written.
    cubins.remember(_fake_dispatcher("uint16", b"x", "e"), "box-a", (np.uint8,), (9, 0))
    assert cubins.load("box-a", (9, 0)) is None
    # A corrupt sidecar makes the entry unusable rather than an error.
    (meta,) = tmp_path.glob("cubins/contour-uint8-c1-*.json")
    meta.write_text("{not json")
    assert cubins.load("contour-uint8-c1", (9, 0)) is None
    meta.write_text(json.dumps({"entry": 3}))
    assert cubins.load("contour-uint8-c1", (9, 0)) is None


def test_a_kernel_that_ships_is_not_cached_again(tmp_path, monkeypatch):
    """The user's cache holds only what the shipped kernels lack: a shipped kernel is
    loaded from the package and never written to the cache."""
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cubins, "_saved", set())
    ships = {"contour-uint8-c1": (b"fatbin", "_Zshipped")}
    monkeypatch.setattr(cubins.shipped, "find", lambda n, cc: ("path", "e") if n in ships else None)
    monkeypatch.setattr(cubins.shipped, "load", lambda n, cc: ships.get(n))
    cubins.remember(_fake_dispatcher("uint8", b"img", "_Zc"), "contour-uint8-c1", (np.uint8,),
                    (9, 0))  # fmt: skip
    assert not list(tmp_path.rglob("*.cubin"))
    assert cubins.load("contour-uint8-c1", (9, 0)) == (b"fatbin", "_Zshipped")
    cubins.remember(_fake_dispatcher("uint8", b"img", "_Zb"), "box-x", (np.uint8,), (9, 0))
    assert len(list(tmp_path.rglob("*.cubin"))) == 1  # not shipped: cached
    assert cubins.load("box-x", (9, 0)) == (b"img", "_Zb")


def test_a_later_process_finds_an_exported_cubin_without_parsing_sources(tmp_path, monkeypatch):
    """The exporting process records the family's closure; a later process (the cache
    of digests cleared) computes the digest from that record, reading the sources but
    parsing none, and finds the cubin."""
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cubins, "_saved", set())
    monkeypatch.setattr(cubins.shipped, "manifest", lambda: {})
    cubins._digest.cache_clear()
    fake = _fake_dispatcher("uint8", b"\x7fELF...", "_Z7contour")
    cubins.remember(fake, "contour-uint8-c1", (np.uint8,), (9, 0))
    recorded = json.loads((tmp_path / "cubins" / "closures.json").read_text())
    assert recorded["contour"] == list(cubins.shipped.closure(("contour.kernel",)))
    cubins._digest.cache_clear()  # as in a new process

    def no_parsing(*args):
        raise AssertionError("sources parsed")

    monkeypatch.setattr(cubins.shipped, "closure", no_parsing)
    assert cubins.load("contour-uint8-c1", (9, 0)) == (b"\x7fELF...", "_Z7contour")
    cubins._digest.cache_clear()


def test_a_kernel_never_exported_is_looked_up_without_a_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cubins.shipped, "load", lambda name, cc: (b"shipped", "_Z"))

    def no_digest(*args):
        raise AssertionError("digest computed")

    monkeypatch.setattr(cubins, "_digest", no_digest)
    assert cubins.load("contour-uint8-c1", (9, 0)) == (b"shipped", "_Z")


def test_a_stale_closure_record_misses_or_falls_back_to_parsing(tmp_path, monkeypatch):
    monkeypatch.setenv("IMGFILTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cubins, "_saved", set())
    monkeypatch.setattr(cubins.shipped, "manifest", lambda: {})
    cubins._digest.cache_clear()
    cubins.remember(_fake_dispatcher("uint8", b"img", "_Zc"), "contour-uint8-c1", (np.uint8,),
                    (9, 0))  # fmt: skip
    record = tmp_path / "cubins" / "closures.json"
    # A module that no longer exists: parse instead, and find the cubin.
    record.write_text(json.dumps({"contour": ["contour.kernel", "no_such_module"]}))
    cubins._digest.cache_clear()
    assert cubins.load("contour-uint8-c1", (9, 0)) == (b"img", "_Zc")
    # A record that leaves out a module the kernel imports now: a different digest,
    # so the cubin is not found (compiled again), never a stale one used.
    record.write_text(json.dumps({"contour": ["contour.kernel"]}))
    cubins._digest.cache_clear()
    assert cubins.shipped.closure(("contour.kernel",)) != ["contour.kernel"]  # it imports others
    assert cubins.load("contour-uint8-c1", (9, 0)) is None
    # The next export records the closure again.
    monkeypatch.setattr(cubins, "_saved", set())
    cubins.remember(_fake_dispatcher("uint8", b"img", "_Zc"), "contour-uint8-c1", (np.uint8,),
                    (9, 0))  # fmt: skip
    assert json.loads(record.read_text())["contour"] == cubins.shipped.closure(("contour.kernel",))
    assert cubins.load("contour-uint8-c1", (9, 0)) == (b"img", "_Zc")
    cubins._digest.cache_clear()


def test_store_name_carries_the_specialisation():
    geo = {"sum_type": np.uint16, "magic_rounding": True}
    assert cubins.box_name(geo, 3, np.uint8) == "box_fused-uint8-uint16-c3-m1"
    tiled = {"threads": 256, "run": 16, "tile_w": 64, "tile_h": 32, "groups": 2}
    assert cubins.tiled_name(tiled, 3, (21, 5)) == "box_tiled-c3-k21x5-t256-r16-w64-h32-g2-b0"
    assert cubins.contour_name(4, np.uint16) == "contour-uint16-c4"
    assert cubins.blocked_name(21, 5, np.float32) == "blocked-float32-21x5"


@pytest.mark.gpu
def test_second_process_filters_without_numba_and_matches(tmp_path):
    env = {"IMGFILTER_CACHE_DIR": str(tmp_path), "NUMBA_ENABLE_CUDASIM": "0"}
    env |= {"IMGFILTER_NO_PREBUILT": "1", "IMGFILTER_BACKGROUND_COMPILE": "0"}
    env["IMGFILTER_DEBUG_CUBINS"] = "1"
    code = """
        import sys
        import numpy as np
        import imgfilter
        rng = np.random.default_rng(0)
        outs = {}
        kern = rng.standard_normal((9, 7)).astype(np.float32) / 20
        for shape, dtype in [((333, 517, 3), np.uint8), ((200, 301, 1), np.uint16)]:
            img = rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
            for k in (3, 21, 101):
                outs[f"blur{k}{shape}"] = imgfilter.blur(img, k, border="constant", border_value=9)
            outs[f"contour{shape}"] = imgfilter.contour(img, border="wrap")
            outs[f"filter{shape}"] = imgfilter.filter2d(img, kern, border="reflect")
            into = np.empty_like(img)  # out= takes the copy back directly
            assert imgfilter.blur(img, 21, border="constant", border_value=9, out=into) is into
            np.testing.assert_array_equal(into, outs[f"blur21{shape}"])
        img = rng.standard_normal((150, 211, 4)).astype(np.float32)
        outs["filter_float"] = imgfilter.filter2d(img, kern, border="constant", border_value=0.5)
        np.savez("{out}", **outs)
        print("numba" in sys.modules)
        """
    first = _python(code.replace("{out}", str(tmp_path / "first.npz")), env)
    assert first.returncode == 0 and "failed" not in first.stderr, first.stderr
    assert first.stdout.strip() == "True"  # compiled through Numba, cubins exported
    for kind in ("box_tiled", "box_fused", "box_twopass-rows", "box_twopass-columns", "contour",
                 "blocked"):  # fmt: skip
        assert any((tmp_path / "cubins").glob(f"{kind}-*.cubin")), kind
    second = _python(code.replace("{out}", str(tmp_path / "second.npz")), env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "False"  # every case ran from the cached cubins
    a, b = np.load(tmp_path / "first.npz"), np.load(tmp_path / "second.npz")
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.gpu
def test_large_host_images_go_in_bands_through_the_quick_start(tmp_path):
    """Host images of BANDS_MIN_BYTES or more go through the GPU in row bands by
    default; in a fresh process with only the shipped kernels, the bands run from
    them (kernels specialised for a size compile in the background meanwhile), without
    Numba, and equal the whole image."""
    env = {"IMGFILTER_CACHE_DIR": str(tmp_path), "NUMBA_ENABLE_CUDASIM": "0"}
    done = _python(
        """
        import sys
        import numpy as np
        import imgfilter
        from imgfilter import api
        rng = np.random.default_rng(2)
        kern = rng.standard_normal((9, 7)).astype(np.float32) / 20
        for shape, dtype in [((2900, 4001, 3), np.uint8), ((2100, 4003, 3), np.uint16)]:
            img = rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
            assert img.nbytes >= api.BANDS_MIN_BYTES
            for name, call in (
                ("blur21", lambda **kw: imgfilter.blur(img, 21, border="constant", **kw)),
                ("blur5", lambda **kw: imgfilter.blur(img, 5, border="wrap", **kw)),
                ("contour", lambda **kw: imgfilter.contour(img, border="reflect", **kw)),
                ("filter", lambda **kw: imgfilter.filter2d(img, kern, **kw)),
            ):
                whole = call(max_gpu_bytes=1 << 62)
                np.testing.assert_array_equal(call(), whole, err_msg=name)
        print("numba" in sys.modules)
        """,
        env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"  # bands and whole images ran from the shipped cubins


@pytest.mark.gpu
def test_command_line_quick_start_gives_the_numba_result(tmp_path):
    import cv2

    env = {"IMGFILTER_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_ENABLE_CUDASIM": "0"}
    env |= {"IMGFILTER_NO_PREBUILT": "1", "IMGFILTER_BACKGROUND_COMPILE": "0"}
    img = np.random.default_rng(1).integers(0, 256, (401, 603, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "in.png"), img)
    outs = []
    for run in ("numba", "quick"):
        out = tmp_path / f"{run}.png"
        done = subprocess.run(
            [sys.executable, "-m", "imgfilter", "blur", str(tmp_path / "in.png"), "--k", "21",
             "-o", str(out), "--backend", "cuda"],
            capture_output=True, text=True, timeout=600, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, PYTHONPATH]), **env},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outs.append(cv2.imread(str(out), cv2.IMREAD_UNCHANGED))
    assert any((tmp_path / "cache" / "cubins").glob("box_tiled-*.cubin"))  # k=21, uint8
    np.testing.assert_array_equal(outs[0], outs[1])


def test_device_bands_run_quick_only_inside_bands(monkeypatch):
    """The row bands of a streamed host image (device arrays with their stream handle)
    go through the quick start while `bands` is active, their results into the band's
    device out on that stream; other device arrays, and host images given a stream, go
    to the fallback (the Numba path)."""
    from imgfilter.backends import cached
    from kernels.common.devarray import DeviceArray

    seen = []

    def quick(img, *args):
        seen.append(
            (img, cached._caller_out(img.shape, img.dtype, DeviceArray), cached._CALLER.stream)
        )
        return seen[-1][1]

    class Fallback:
        calls = []

        def box(self, img, *args):
            self.calls.append(img)
            return "fallback"

    fallback = Fallback()
    monkeypatch.setattr(cached, "_box_quick", quick)
    band = DeviceArray(1 << 20, (4, 5, 3), np.uint8)
    dst = DeviceArray(1 << 21, (4, 5, 3), np.uint8)
    args = ((3, 3), (1, 1), 0, 0, "auto", dst)
    assert cached.box(band, *args, 7, fallback=lambda: fallback) == "fallback"
    with cached.device_arrays():
        assert cached.box(band, *args, 7, fallback=lambda: fallback) is dst
        assert seen[-1] == (band, dst, 7)
        strided = DeviceArray(1 << 20, (4, 5, 3), np.uint8, strides=(30, 6, 1))
        assert cached.box(strided, *args, 7, fallback=lambda: fallback) == "fallback"
        host = np.ones((4, 5, 3), np.uint8)
        assert cached.box(host, (3, 3), (1, 1), 0, 0, "auto", None, 7,
                          fallback=lambda: fallback) == "fallback"  # fmt: skip
    assert cached.box(band, *args, 7, fallback=lambda: fallback) == "fallback"  # bands ended
    assert cached._CALLER.stream == cached._STREAM and cached._CALLER.out is None
    assert len(seen) == 1 and len(fallback.calls) == 4


@pytest.fixture
def any_cubin_loads(monkeypatch):
    """`imgfilter.backends.cached` with a stand-in driver on which every cubin loads (as
    function handle 1): `_run` without a GPU."""
    from imgfilter.backends import cached

    class Driver:
        cc = (9, 0)

    monkeypatch.setattr(cached, "_driver", lambda: Driver())
    monkeypatch.setattr(cached, "_function", lambda drv, name: 1)
    return cached


def test_a_device_array_without_out_gets_a_pool_array(monkeypatch, any_cubin_loads):
    """`_run` on a device array writes into the caller's device out, or (none given)
    into a new pool array of the result's shape allocated on the caller's stream."""
    from kernels.common.devarray import DeviceArray

    cached = any_cubin_loads
    made = []

    def empty(shape, dtype, stream):
        made.append((shape, np.dtype(dtype), stream))
        return DeviceArray(1 << 22, shape, dtype)

    monkeypatch.setattr(cached.devarray, "empty", empty)
    launched = []
    band = DeviceArray(1 << 20, (4, 5, 3), np.uint8)
    with cached.device_arrays(), cached._results_into(None, 9):
        new = cached._run("k", band, (4, 5), lambda *a: launched.append(a))
    assert made == [((4, 5), np.dtype(np.uint8), 9)]
    assert new.ptr == 1 << 22 and new.shape == (4, 5)
    dst = DeviceArray(1 << 21, (4, 5, 3), np.uint8)
    with cached.device_arrays(), cached._results_into(dst, 9):
        assert cached._run("k", band, band.shape, lambda *a: launched.append(a)) is dst
    assert len(made) == 1
    assert [a[1:] for a in launched] == [(1, 9, band.ptr, 1 << 22), (1, 9, band.ptr, dst.ptr)]


def test_scratch_and_weights_live_until_their_launch_is_queued(monkeypatch, any_cubin_loads):
    """A pool block dropped before its launch is queued could be handed to another
    thread's allocation on the same stream first (both then use it): `_run` holds the
    uploaded weights and the scratch until `launch` returns."""
    import weakref

    from kernels.common.devarray import DeviceArray

    cached = any_cubin_loads
    refs = []

    def empty(shape, dtype, stream):
        arr = DeviceArray(1 << (22 + len(refs)), shape, dtype)
        refs.append(weakref.ref(arr))
        return arr  # the caller holds the only reference

    monkeypatch.setattr(cached.devarray, "empty", empty)
    monkeypatch.setattr(cached.devarray, "to_device",
                        lambda host, stream: empty(host.shape, host.dtype, stream))  # fmt: skip
    alive = []

    def launch(drv, fn, stream, *pointers):
        alive.append([ref() is not None for ref in refs])

    band = DeviceArray(1 << 20, (4, 5, 3), np.uint8)
    for kwargs in ({"extra": np.ones(9, np.float32)}, {"scratch_bytes": 64}):
        refs.clear()
        with cached.device_arrays(), cached._results_into(None, 9):
            cached._run("k", band, band.shape, launch, **kwargs)
    assert alive == [[True, True], [True, True]]  # the new output and the extra block
