"""Choosing the CUDA backend without loading NVVM: `backends.nvvm_file` finds the
library where NVIDIA's wheels and toolkits put it, and `_cuda_problem` loads NVVM
only when it is found nowhere there and no kernels ship for the GPU."""

from __future__ import annotations

import sys
import types

import pytest

from imgfilter import backends


def _fake_numba_cuda(monkeypatch, loads: list):
    """numba.cuda with a GPU, and an NVVM whose loading is recorded."""
    import numba

    monkeypatch.setattr(backends, "_driver_problem", lambda: None)  # a driver and a GPU
    monkeypatch.setattr(backends, "_kernels_ship", lambda: False)  # a GPU none ship for
    monkeypatch.setattr(numba.cuda, "is_available", lambda: True)
    nvvm = types.ModuleType("numba.cuda.cudadrv.nvvm")
    nvvm.NVVM = lambda: loads.append("loaded")
    monkeypatch.setitem(sys.modules, "numba.cuda.cudadrv.nvvm", nvvm)


@pytest.fixture
def real_gpu_path(monkeypatch):
    """As on a GPU machine: no simulator, and no cached answer."""
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    backends._cuda_problem.cache_clear()
    backends.compiler_problem.cache_clear()
    yield
    backends._cuda_problem.cache_clear()
    backends.compiler_problem.cache_clear()


def _no_toolkits(monkeypatch):
    for name in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(backends, "_TOOLKIT_ROOTS", ())
    monkeypatch.setattr(backends, "_TOOLKIT_VERSIONS", "/nonexistent-cuda-*")


@pytest.mark.parametrize("where", ["nvidia/cu13/lib", "nvidia/cuda_nvcc/nvvm/lib64"])
def test_a_wheel_s_libnvvm_is_found_without_loading_it(tmp_path, monkeypatch, where,
                                                       real_gpu_path):  # fmt: skip
    _no_toolkits(monkeypatch)
    lib = tmp_path / where / "libnvvm.so.4"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "nothing"), str(tmp_path)])
    assert backends.nvvm_file() == str(lib)
    loads: list = []
    _fake_numba_cuda(monkeypatch, loads)
    assert backends._cuda_problem() is None and loads == []


def test_a_toolkit_s_libnvvm_is_found_through_cuda_home(tmp_path, monkeypatch):
    _no_toolkits(monkeypatch)
    monkeypatch.setattr(sys, "path", [])
    lib = tmp_path / "nvvm" / "lib64" / "libnvvm.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert backends.nvvm_file() == str(lib)


def test_found_nowhere_nvvm_is_loaded_to_decide(tmp_path, monkeypatch, real_gpu_path):
    _no_toolkits(monkeypatch)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert backends.nvvm_file() is None
    loads: list = []
    _fake_numba_cuda(monkeypatch, loads)
    assert backends._cuda_problem() is None and loads == ["loaded"]
    backends._cuda_problem.cache_clear()
    backends.compiler_problem.cache_clear()

    def missing():
        raise OSError("libnvvm.so: cannot open shared object file")

    sys.modules["numba.cuda.cudadrv.nvvm"].NVVM = missing
    assert "NVVM" in backends._cuda_problem()


def test_without_a_gpu_numba_s_cuda_target_is_not_asked(monkeypatch, real_gpu_path):
    import numba.cuda

    from kernels.common import cudadrv

    def no_driver():
        raise cudadrv.CudaError("no NVIDIA driver found (libcuda)")

    def must_not_be_asked():
        raise AssertionError("Numba's CUDA target asked although the driver said no")

    monkeypatch.setattr(cudadrv, "driver", no_driver)
    monkeypatch.setattr(numba.cuda, "is_available", must_not_be_asked)
    assert backends._cuda_problem() == "no usable NVIDIA GPU was found"
    backends._cuda_problem.cache_clear()

    def full():
        raise cudadrv.NoMemoryForContext("GPU 0 has no memory left for a CUDA context")

    monkeypatch.setattr(cudadrv, "driver", full)
    assert backends._cuda_problem() == "GPU 0 has no memory left for a CUDA context"


def test_shipped_kernels_need_no_compiler(tmp_path, monkeypatch, real_gpu_path):
    """A GPU the package ships kernels for takes the CUDA backend without NVVM: no
    compiler is looked for (the kernels run from their binaries)."""
    _no_toolkits(monkeypatch)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    loads: list = []
    _fake_numba_cuda(monkeypatch, loads)
    monkeypatch.setattr(backends, "_kernels_ship", lambda: True)
    assert backends._cuda_problem() is None and loads == []

    def missing():
        raise OSError("libnvvm.so: cannot open shared object file")

    sys.modules["numba.cuda.cudadrv.nvvm"].NVVM = missing
    assert "NVVM" in backends.compiler_problem()  # what a compile would need (classify)
