"""The C launcher (`kernels/common/_launch.c`) behind `cudadrv.PreparedLaunch`: given a
C function in place of cuLaunchKernelEx (a ctypes callback that records what it is
handed), each launch writes the same parameter bytes and stream as the Python steps,
refuses bad `bases`, and reports the driver's status.

`pip install` builds the launcher into the installed package; the tests import the
tree's `kernels`, so where no built copy sits in the tree they build one into a
temporary folder (skipped without a C compiler)."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import extensions
import pytest

from kernels.common import cudadrv

SOURCE = Path(cudadrv.__file__).with_name("_launch.c")
PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_void_p)  # fmt: skip


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The Launch type of the built C launcher (built here if need be)."""
    if cudadrv._CompiledLaunch is not None:
        return cudadrv._CompiledLaunch
    return extensions.build("_launch", SOURCE, tmp_path_factory.mktemp("launch")).Launch


class _Driver:
    """A stand-in for cudadrv.Driver whose cuLaunchKernelEx is a C-callable callback."""

    def __init__(self):
        self.launches = []
        self.status = 0
        self._tls = cudadrv._ThreadState()
        self._tls.ready = True

        def launch(config_address, fn, kernel_params, extra_address):
            config = cudadrv._LaunchConfig.from_address(config_address)
            extra = (ctypes.c_void_p * 5).from_address(extra_address)
            size = ctypes.c_size_t.from_address(extra[3]).value
            params = ctypes.string_at(extra[1], size)
            self.launches.append((fn, config.hStream or 0, kernel_params, params))
            return self.status

        self._callback = PROTOTYPE(launch)

        class Lib:
            cuLaunchKernelEx = self._callback

        self._lib = Lib()

    def current(self):
        self._tls.ready = True

    def check(self, status, name):
        if status:
            raise cudadrv.CudaError(f"{name} failed: {status}", status)


PACKER = struct.Struct("@iQQfQ")  # an int, two pointers, a float, a pointer
PATCHES = ((1, 0, 0), (2, 1, 64), (4, 0, 8))  # parameter, slot, byte offset


@pytest.fixture
def driver(compiled, monkeypatch):
    monkeypatch.setattr(cudadrv, "_CompiledLaunch", compiled)
    monkeypatch.delenv("IMGFILTER_PYTHON_LAUNCH", raising=False)
    return _Driver()


def _prepared(drv):
    return cudadrv.Driver.prepare(drv, 99, (3, 1, 1), (128, 1, 1), 0, PACKER,
                                  [7, 0, 0, 2.5, 0], PATCHES)  # fmt: skip


def test_the_c_launcher_writes_what_the_python_steps_write(driver, monkeypatch):
    step = _prepared(driver)
    assert step._compiled is not None
    monkeypatch.setenv("IMGFILTER_PYTHON_LAUNCH", "1")
    python_step = _prepared(driver)
    assert python_step._compiled is None
    cases = [(5, [1 << 30, 2 << 30]), (5, (3 << 30, 4 << 30)), (0, [8, 16]),
             (6, [(1 << 64) - 4096, 1 << 41]), (2, (1 << 40, 1 << 41))]  # fmt: skip
    for stream, bases in cases:
        for which in (step, python_step):
            which.launch(stream, bases)
        c_made, python_made = driver.launches[-2:]
        assert c_made == python_made
        fn, got_stream, kernel_params, params = c_made
        assert (fn, got_stream, kernel_params) == (99, stream, None)
        assert PACKER.unpack(params) == (7, bases[0], bases[1] + 64, 2.5, bases[0] + 8)


def test_the_c_launcher_reports_the_drivers_status(driver):
    step = _prepared(driver)
    driver.status = 719
    with pytest.raises(cudadrv.CudaError, match="cuLaunchKernelEx failed: 719"):
        step.launch(1, [1, 2])


@pytest.mark.parametrize(
    "bases, error",
    [([1], IndexError), ({0: 1, 1: 2}, TypeError), ([1.5, 2], TypeError), ([-1, 2], OverflowError)],
)
def test_the_c_launcher_refuses_bad_bases_before_launching(driver, bases, error):
    step = _prepared(driver)
    with pytest.raises(error):
        step.launch(1, bases)
    assert driver.launches == []


def test_the_c_launcher_refuses_bad_patches(compiled):
    with pytest.raises(ValueError, match=">= 0"):
        compiled(1, 1, 1, 1, 1, 1, ((-1, 0, 0),))
    with pytest.raises(TypeError):
        compiled(1, 1, 1, 1, 1, 1, [(0, 0, 0)])  # a list, not a tuple
    with pytest.raises(ValueError, match="null address"):
        compiled(0, 1, 1, 1, 1, 1, ())
