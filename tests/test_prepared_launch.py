"""`kernels.common.cudadrv.PreparedLaunch` with a stand-in for the driver bindings: each
launch hands the driver the recorded parameters with only the patched pointers changed,
and the stream it was given, however the streams alternate."""

from __future__ import annotations

import ctypes
import struct

import pytest
from cuda.bindings import driver as bindings

from kernels.common import cudadrv


def read_launch(config, extra_address):
    """(stream, grid x, block x, parameter bytes) of what cuLaunchKernelEx was handed:
    `config` a CUlaunchConfig, `extra_address` the address of its `extra` array."""
    extra = (ctypes.c_void_p * 5).from_address(extra_address)
    assert (extra[0], extra[2], extra[4]) == (1, 2, None)  # buffer, size, end markers
    size = ctypes.c_size_t.from_address(extra[3]).value
    params = ctypes.string_at(extra[1], size)
    return int(config.hStream), config.gridDimX, config.blockDimX, params


class _Bindings:
    """Stands in for cuda.bindings.driver: records what each cuLaunchKernelEx call
    would launch: (fn, stream, params, grid x)."""

    CUlaunchConfig = bindings.CUlaunchConfig

    def __init__(self):
        self.launches = []
        self.status = 0

    def cuLaunchKernelEx(self, config, fn, kernel_params, extra_address):
        assert kernel_params is None
        stream, grid, _, params = read_launch(config, extra_address)
        self.launches.append((fn, stream, params, grid))
        return (self.status,)


class _Driver:
    def __init__(self):
        self._cu = _Bindings()
        self._tls = cudadrv._ThreadState()
        self.made_current = 0

    _config = cudadrv.Driver._config

    def current(self):
        self.made_current += 1
        self._tls.ready = True

    def check(self, status, name):
        if status:
            raise cudadrv.CudaError(f"{name} failed: {status}", status)


PACKER = struct.Struct("@iqqfq")  # an int, two pointers, a float, a pointer


def _prepared(drv):
    values = [7, 0, 0, 2.5, 0]
    # parameter 1 <- slot 0, parameter 2 <- slot 1 + 64, parameter 4 <- slot 0 + 8
    patches = ((1, 0, 0), (2, 1, 64), (4, 0, 8))
    return cudadrv.Driver.prepare(drv, 99, (3, 1, 1), (128, 1, 1), 0, PACKER, values, patches)


def test_each_launch_packs_the_new_pointers_and_its_stream():
    drv = _Driver()
    step = _prepared(drv)
    for stream, bases in [(5, [1 << 30, 2 << 30]), (5, [3 << 30, 4 << 30]), (0, [8, 16]),
                          (6, [1 << 40, 1 << 41])]:  # fmt: skip
        step.launch(stream, bases)
        fn, got_stream, params, grid = drv._cu.launches[-1]
        assert (fn, got_stream, grid) == (99, stream, 3)
        assert PACKER.unpack(params) == (7, bases[0], bases[1] + 64, 2.5, bases[0] + 8)
    assert drv.made_current == 1


def test_a_failed_launch_raises_cuda_error():
    drv = _Driver()
    step = _prepared(drv)
    drv._cu.status = 719
    with pytest.raises(cudadrv.CudaError, match="cuLaunchKernelEx"):
        step.launch(1, [1, 2])


def test_pointer_parameters_must_be_word_aligned():
    odd = struct.Struct("@iq")
    with pytest.raises(ValueError, match="8-byte aligned"):
        cudadrv.PreparedLaunch(_Driver(), 1, (1, 1, 1), (1, 1, 1), 0, odd, [0, 0], ((4, 0, 0),))


@pytest.mark.parametrize("count", [1, 2, 3, 4, 6])
def test_every_patched_pointer_is_written_however_many_there_are(count):
    """Each patched pointer lands at its own parameter, from its own slot and
    offset, and the other parameters stay, whatever the number of pointers."""
    drv = _Driver()
    packer = struct.Struct("@i" + "q" * count)
    values = [-3] + [0] * count
    patches = tuple((1 + j, j % 2, 8 * j) for j in range(count))
    step = cudadrv.Driver.prepare(drv, 5, (1, 1, 1), (32, 1, 1), 0, packer, values, patches)
    for bases in ([1 << 30, 1 << 31], [7 << 32, 9 << 32]):
        step.launch(3, bases)
        got = packer.unpack(drv._cu.launches[-1][2])
        assert got == (-3, *(bases[j % 2] + 8 * j for j in range(count)))


def test_parameters_sit_at_their_c_offsets():
    """The bytes cuLaunchKernelEx receives: the template packed once, the patched
    pointers at their C-aligned offsets (padding before each 64-bit one)."""
    drv = _Driver()
    packer = struct.Struct("@biqhq")  # padding before each q: offsets 0, 4, 8, 16, 24
    assert cudadrv.param_offsets(packer) == [0, 4, 8, 16, 24]
    step = cudadrv.Driver.prepare(drv, 99, (3, 1, 1), (64, 1, 1), 0, packer,
                                  [-5, 7, 0, 300, 0], ((2, 0, 16), (4, 1, 0)))  # fmt: skip
    step.launch(11, [1 << 40, 5 << 33])
    step.launch(12, [2 << 40, 6 << 33])
    (_, _, first, _), (_, _, second, _) = drv._cu.launches
    assert packer.unpack(first) == (-5, 7, (1 << 40) + 16, 300, 5 << 33)
    assert packer.unpack(second) == (-5, 7, (2 << 40) + 16, 300, 6 << 33)
