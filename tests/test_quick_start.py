"""A later process: the kernels an earlier one compiled (kept in the kernel cache,
`kernels.common.binaries`) or the shipped ones, launched without importing Numba.

Without a GPU: the CUDA backend and the launch layer import no Numba, the command line
opens the GPU early where kernels ship or are cached (`backends.warmup`) and the
backend then uses that context, and kernel parameters are laid out as Numba lays them
out. The kernel cache itself is tested in test_binaries. On a GPU (`gpu`): a second
process filters from the cached binaries without importing Numba and gets exactly what
the first (which compiled them) gave.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kernels.common.cudadrv import array_params, scalar_param

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHONPATH = os.environ.get("PYTHONPATH", "")
CACHED = "launch-0123456789abcdef01234567"  # a binary's name in the kernel cache


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


def test_the_cuda_backend_and_the_launch_layer_import_no_numba():
    done = _python(
        """
        import sys
        import imgfilter.backends.cuda, imgfilter.backends.cuda_lists
        import kernels.common.binaries, kernels.common.launch, kernels.common.var_shape
        import kernels.box.dispatch, kernels.contour.launch, kernels.conv.dispatch
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
    monkeypatch.delenv("IMGFILTER_NO_PREBUILT", raising=False)
    shipping = warmup.PREBUILT_MANIFEST
    assert shipping.exists()
    monkeypatch.setattr(warmup, "PREBUILT_MANIFEST", tmp_path / "none.json")
    assert not warmup.wanted(["blur", "in.jpg", "--k", "21"])  # no kernels cached or shipped
    (tmp_path / "cubins").mkdir()
    (tmp_path / "cubins" / f"{CACHED}.pending").write_bytes(b"")  # a compile, not a kernel
    (tmp_path / "cubins" / f"{CACHED}-sm90.json").write_bytes(b"{}")
    assert not warmup.wanted(["blur", "in.jpg", "--k", "21", "--backend", "cuda"])
    (tmp_path / "cubins" / f"{CACHED}-sm90.cubin").write_bytes(b"x")
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
    (tmp_path / "cubins" / f"{CACHED}-sm90.cubin").unlink()
    monkeypatch.setattr(warmup, "PREBUILT_MANIFEST", shipping)  # kernels ship
    assert warmup.wanted(["blur", "in.jpg", "--backend", "cuda"])
    monkeypatch.setenv("IMGFILTER_NO_PREBUILT", "1")  # ... switched off
    assert not warmup.wanted(["blur", "in.jpg", "--backend", "cuda"])


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
    (tmp_path / "cubins").mkdir()
    (tmp_path / "cubins" / f"{CACHED}-sm90.cubin").write_bytes(b"x")
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
    monkeypatch.setattr(warmup, "PREBUILT_MANIFEST", tmp_path / "none.json")
    assert warmup.wanted(["classify", "in.jpg", "-m", "model.npz"])
    assert warmup.wanted(["train", "in.jpg", "labels.png", "--backend", "cuda"])
    assert not warmup.wanted(["classify", "in.jpg", "-m", "m.npz", "--backend", "cpu"])
    assert not warmup.wanted(["train", "--help"])
    assert not warmup.wanted(["blur", "in.jpg", "--k", "3"])  # no cubins: Numba compiles
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert not warmup.wanted(["classify", "in.jpg", "-m", "model.npz"])


@pytest.mark.parametrize("fails", [False, True])
def test_the_backend_launches_in_the_context_the_command_line_opened_early(monkeypatch, fails):
    """`warmup.start` opens the driver on a background thread while the CLI imports;
    the launch layer's `driver()` is then that one (opened once); where the driver
    fails, the backend's first call asks again and fails as without the warmup."""
    import threading

    from imgfilter.backends import warmup
    from kernels.common import cudadrv

    opened = []

    class FakeDriver:
        cc = (9, 0)

        def __init__(self):
            opened.append(threading.current_thread().name)
            if fails:
                raise cudadrv.CudaError("cuInit failed: CUDA_ERROR_NO_DEVICE")
            self.current_on = []

        def current(self):
            self.current_on.append(threading.current_thread().name)

    monkeypatch.setattr(cudadrv, "Driver", FakeDriver)
    monkeypatch.setattr(cudadrv, "_driver", None)
    monkeypatch.setattr(warmup, "_thread", None)
    monkeypatch.setattr(warmup, "_result", [])
    monkeypatch.setattr(warmup, "wanted", lambda argv: True)
    assert warmup.start(["blur", "in.jpg"])
    if fails:
        assert warmup.driver() is None
        with pytest.raises(cudadrv.CudaError):
            cudadrv.driver()
        assert opened == ["imgfilter-cuda-init", threading.current_thread().name]
    else:
        drv = warmup.driver()  # opened on the background thread, then bound to this one
        assert cudadrv.driver() is drv and opened == ["imgfilter-cuda-init"]
        assert drv.current_on == [threading.current_thread().name]


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
    assert first.stdout.strip() == "True"  # compiled through Numba, binaries exported
    kept = sorted((tmp_path / "cubins").glob("launch-*.cubin"))
    closures = [json.loads(path.with_suffix(".json").read_text())["closure"] for path in kept]
    for module in ("box.tiled", "box.fused", "box.twopass", "contour.kernel", "conv.blocked"):
        # a kernel of that module was kept (a register-blocked kernel's code is generated
        # source, so its entry names no kernels module: its sidecar's closure does)
        assert any(module in closure for closure in closures), module
    second = _python(code.replace("{out}", str(tmp_path / "second.npz")), env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "False"  # every case ran from the cached binaries
    a, b = np.load(tmp_path / "first.npz"), np.load(tmp_path / "second.npz")
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.gpu
def test_large_host_images_go_in_bands_from_the_shipped_kernels(tmp_path):
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
    assert done.stdout.strip() == "False"  # bands and whole images ran from the shipped kernels


@pytest.mark.gpu
def test_command_line_from_cached_kernels_gives_the_numba_result(tmp_path):
    """A blur compiled by Numba in one command, and from the kernel cache in the next,
    are the same image."""
    import cv2

    env = {"IMGFILTER_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_ENABLE_CUDASIM": "0"}
    env |= {"IMGFILTER_NO_PREBUILT": "1", "IMGFILTER_BACKGROUND_COMPILE": "0"}
    img = np.random.default_rng(1).integers(0, 256, (401, 603, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "in.png"), img)
    outs = []
    for run in ("numba", "cached"):
        out = tmp_path / f"{run}.png"
        done = subprocess.run(
            [sys.executable, "-m", "imgfilter", "blur", str(tmp_path / "in.png"), "--k", "21",
             "-o", str(out), "--backend", "cuda"],
            capture_output=True, text=True, timeout=600, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, PYTHONPATH]), **env},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outs.append(cv2.imread(str(out), cv2.IMREAD_UNCHANGED))
    assert any((tmp_path / "cache" / "cubins").glob("launch-*.cubin"))  # k=21, uint8: box_tiled
    np.testing.assert_array_equal(outs[0], outs[1])
