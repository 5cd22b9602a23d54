"""Launch geometry shared by the image kernels."""

from __future__ import annotations

import contextlib
import functools
import os
import struct
import threading

import numpy as np

from . import binaries, replay, shipped
from .arrays import (
    as_device_array,
    empty,
)
from .cudadrv import SMEM_DEFAULT, CudaError, driver
from .devarray import POOL, DeviceArray, _recorder
from .refs import KernelRef, dispatcher_of, key_of

BLOCK_X = 32  # threads along a row: one warp reads 32 consecutive pixels
BLOCK_Y = 8
SMEM_LIMIT = 48 * 1024  # dynamic shared memory a block may use without opting in


def cdiv(a: int, b: int) -> int:
    """Ceiling division for positive integers."""
    return -(-a // b)


def image_grid(height: int, width: int, channels: int) -> tuple[tuple, tuple]:
    """(grid, block) covering an (H, W, C) image: x over columns, y over rows, z channels."""
    block = (BLOCK_X, BLOCK_Y, 1)
    grid = (cdiv(width, BLOCK_X), cdiv(height, BLOCK_Y), channels)
    return grid, block


def scratch(shape: tuple, dtype, stream: int = 0):
    """A device work buffer for launches on `stream`: taken from the stream-ordered
    pool (`kernels.common.devarray`), so dropping it after the launches that use it is safe
    and the next call on the stream reuses the memory without cuMemAlloc. While a
    `Batching` is active, a buffer for each image of the batch (the first returned)."""
    batching = batch_state.active
    if batching is not None:
        return batching.scratch(shape, dtype, stream)
    return empty(shape, dtype, stream)


# ------------------------------------------------------- row-wise kernels (softmax, GEMV)

WAVES = 32  # OneFlow's GetNumBlocks: enough blocks for this many full waves


_ATTR_SM_COUNT = 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
_ATTR_THREADS_PER_SM = 39  # CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR


@functools.cache
def device_limits() -> tuple[int, int]:
    """(SM count, max resident threads per SM) of the device."""
    if SIMULATOR:
        from numba import cuda

        dev = cuda.get_current_device()
        return int(dev.MULTIPROCESSOR_COUNT), int(dev.MAX_THREADS_PER_MULTIPROCESSOR)
    drv = driver()
    return drv.attribute(_ATTR_SM_COUNT), drv.attribute(_ATTR_THREADS_PER_SM)


def wave_blocks(block_size: int, work_blocks: int, waves: int = WAVES) -> int:
    """Grid size for a grid-stride kernel, as OneFlow's GetNumBlocks.

    As many blocks as the work needs (`work_blocks`), but no more than `waves` full
    waves of resident blocks; kernels loop over the rest. At least one block.
    """
    sms, threads_per_sm = device_limits()
    return max(1, min(work_blocks, sms * (threads_per_sm // block_size) * waves))


def active_blocks_per_sm(kernel, block_size: int, smem_bytes: int) -> int:
    """Resident blocks per SM of a compiled kernel (the CUDA occupancy calculator).

    `kernel` is a specialized dispatcher (`dispatcher.specialize(*args)`) or a compiled
    overload. max_cooperative_grid_blocks is cuOccupancyMaxActiveBlocksPerMultiprocessor
    times the SM count.
    """
    overload = kernel
    if hasattr(kernel, "overloads"):
        overload = next(iter(kernel.overloads.values()))
    sms, _ = device_limits()
    return overload.max_cooperative_grid_blocks(block_size, smem_bytes) // sms


def largest_block_keeping_occupancy(active, sizes: tuple[int, ...] = (128, 256, 512, 1024)) -> int:
    """OneFlow's block-size choice for block-per-row kernels.

    `active(block_size)` gives the resident blocks per SM. The smallest size sets the
    most blocks that can be resident; the largest size that still reaches that many
    wins (more threads per row at the same occupancy). Returns 0 when even the
    smallest cannot launch (e.g. too much shared memory).
    """
    most = active(sizes[0])
    if most <= 0:
        return 0
    best = sizes[0]
    for size in sizes[1:]:
        if active(size) == most:
            best = size
    return best


def allow_dynamic_smem(kernel, nbytes: int) -> bool:
    """Let a compiled kernel use `nbytes` of dynamic shared memory (opt-in above 48 KiB).

    Numba has no public call for cudaFuncAttributeMaxDynamicSharedMemorySize; this
    sets it the way numba-cuda sets the carve-out attribute. False when the device
    cannot give that much or the attribute cannot be set.
    """
    if nbytes <= SMEM_LIMIT:
        return True
    try:
        from numba.cuda.cudadrv import driver
        from numba.cuda.cudadrv.driver import binding

        overload = kernel
        if hasattr(kernel, "overloads"):
            overload = next(iter(kernel.overloads.values()))
        cufunc = overload._codelibrary.get_cufunc()
        dev = cufunc.device
        if nbytes > dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
            return False
        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver.driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, dev.id)
        return True
    except Exception:
        return False


# ------------------------------------------------------------ the launch layer

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
_INT_CODES = {8: "b", 16: "h", 32: "i", 64: "q"}


class _Compiled:
    """A kernel overload ready to launch: its driver handle and parameter layout.
    library_kernel: the handle is a CUkernel (what Numba loads), not a CUfunction
    (what a shipped cubin loads as)."""

    __slots__ = ("handle", "packer", "library_kernel")

    def __init__(self, handle: int, packer: struct.Struct, library_kernel: bool = True) -> None:
        self.handle, self.packer, self.library_kernel = handle, packer, library_kernel


_compiled: dict = {}
# Held while Numba compiles, loads or exports a kernel: its caches are not thread-safe.
compile_lock = threading.RLock()


def under_compile_lock(fn):
    """fn run holding `compile_lock` (re-entrant): for planning functions that compile
    or query Numba kernels, which is not thread-safe."""

    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with compile_lock:
            return fn(*args, **kwargs)

    return locked


def _arg_key(a):
    t = type(a)
    if t is DeviceArray:
        return a._sig
    if t is tuple:
        return tuple(_arg_key(v) for v in a)
    return t


def _flatten(args, values: list) -> list:
    for a in args:
        t = type(a)
        if t is DeviceArray:
            values += a.params()
        elif t is tuple:
            _flatten(a, values)
        else:
            values.append(a)
    return values


def _numba_type(dispatcher, a):
    from numba import from_dtype, types

    if type(a) is DeviceArray:
        num, ndim, layout = a._sig
        return types.Array(from_dtype(a.dtype), ndim, layout)
    if type(a) is tuple:
        return types.Tuple([_numba_type(dispatcher, v) for v in a])
    return dispatcher.typeof_pyval(a)


def _format(ty) -> str:
    """struct codes of one kernel parameter as Numba flattens it (see numba-cuda's
    `_Kernel._prepare_args`): arrays as meminfo, parent, size, itemsize, data, shape,
    strides; scalars by their type; tuples element by element."""
    from numba import types

    if isinstance(ty, types.Array):
        return "qqqqq" + "q" * (2 * ty.ndim)
    if isinstance(ty, types.Boolean):
        return "?"
    if isinstance(ty, types.Integer):
        code = _INT_CODES[ty.bitwidth]
        return code if ty.signed else code.upper()
    if ty == types.float32:
        return "f"
    if ty == types.float64:
        return "d"
    if ty == types.float16:
        return "e"
    if isinstance(ty, types.BaseTuple):
        return "".join(_format(t) for t in ty)
    raise TypeError(f"kernel parameter type {ty} is not supported by kernels.common.launch")


# Numba's names of the scalar argument types, and their struct codes (Numba's typeof of
# a Python int is int64, of a float float64).
_SCALARS = {bool: ("bool", "?"), int: ("int64", "q"), float: ("float64", "d"),
            np.bool_: ("bool", "?"), np.float16: ("float16", "e"), np.float32: ("float32", "f"),
            np.float64: ("float64", "d")}  # fmt: skip
for _t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
    _bits = np.dtype(_t).itemsize * 8
    _code = _INT_CODES[_bits]
    _SCALARS[_t] = (np.dtype(_t).name, _code if np.dtype(_t).kind == "i" else _code.upper())


def type_name(a) -> str | None:
    """Numba's name of the type of kernel argument `a` (a DeviceArray, a scalar, a
    tuple of them), as `shipped.launch_name` hashes it, without importing Numba; None
    for anything else."""
    t = type(a)
    if t is DeviceArray:
        return f"array({a.dtype.name}, {len(a.shape)}d, {a._sig[2]})"
    if t is tuple:
        names = [type_name(v) for v in a]
        if not names or None in names:
            return None
        if all(n == names[0] for n in names):
            return f"UniTuple({names[0]} x {len(names)})"
        return f"Tuple({', '.join(names)})"
    if t is int and not -(2**63) <= a < 2**63:
        return None  # Numba types it uint64 (or not at all)
    found = _SCALARS.get(t)
    return None if found is None else found[0]


def type_code(a) -> str:
    """struct codes of kernel argument `a` as Numba flattens it (see `_format`)."""
    t = type(a)
    if t is DeviceArray:
        return "qqqqq" + "q" * (2 * len(a.shape))
    if t is tuple:
        return "".join(type_code(v) for v in a)
    return _SCALARS[t][1]


class NotCompiled(LookupError):
    """Raised by a launch inside `checking` where its kernel has no binary (shipped,
    cached or loaded in this process) and would have to be compiled. `kernel`: the
    kernel (a dispatcher or a KernelRef); `name`: its binary's name
    (`shipped.launch_name`), None where it has none."""

    def __init__(self, kernel, name: str | None) -> None:
        super().__init__(f"{kernel!r} is not compiled")
        self.kernel, self.name = kernel, name


class _Checking(threading.local):
    active = False


_checking = _Checking()


@contextlib.contextmanager
def checking():
    """While active in this thread, launches queue nothing: each finds its kernel's
    binary (shipped, cached, or loaded in this process already), or raises
    `NotCompiled` where the kernel would have to be compiled. Run a launch function
    under it to learn whether it can run now without a compile."""
    before, _checking.active = _checking.active, True
    try:
        yield
    finally:
        _checking.active = before


def _check(kernel, args: tuple) -> None:
    if SIMULATOR:
        return
    args = tuple([as_device_array(a) if _is_array(a) else a for a in args])
    key = (kernel, tuple([_arg_key(a) for a in args]))
    with compile_lock:
        if key in _compiled:
            return
        name = _name(kernel, args)
        found = None if name is None else _binary(name, args)
        if found is None:
            raise NotCompiled(kernel, name)
        _compiled[key] = found


def _name(kernel, args: tuple) -> str | None:
    """The binary's name of `kernel`'s overload for `args`, or None."""
    key = kernel.function_key if type(kernel) is KernelRef else key_of(kernel)
    names = tuple(type_name(a) for a in args)
    return None if key is None or None in names else shipped.launch_name(key, names)


def _module(kernel) -> str:
    """The `kernels` module that makes a kernel (a factory's, for a kernel it makes:
    the generated source of a register-blocked kernel has no module of its own), as a
    dotted name inside the package, from the kernel's name (`_name`)."""
    key = kernel.function_key if type(kernel) is KernelRef else key_of(kernel)
    return key.split("|", 1)[0][len("kernels.") :]


def _compile(kernel, args, name: str | None = None, modules: tuple | None = None) -> _Compiled:
    """The overload `args` select, ready to launch: shipped with the package or cached
    by an earlier compile (`kernels.common.binaries`; a KernelRef's without importing
    Numba), else compiled by Numba (or loaded from its cache), loaded on the device and
    exported to the kernel cache; its parameters laid out. name and modules: the
    binary's name and the `kernels` modules it is compiled from, where they are not the
    kernel's own (`_name`, `_module`). Guarded: Numba's loading is not thread-safe."""
    with compile_lock:
        name = name or _name(kernel, args)
        found = None if name is None else _binary(name, args)
        if found is not None:
            return found
        dispatcher = dispatcher_of(kernel)
        argtypes = tuple(_numba_type(dispatcher, a) for a in args)
        compiled = dispatcher.compile(argtypes)
        if compiled.debug or compiled.cooperative or getattr(dispatcher, "extensions", None):
            raise TypeError("debug, cooperative or extended kernels are not launched here")
        handle = compiled._codelibrary.get_cufunc().handle
        handle = int(getattr(handle, "value", None) or int(handle))
        if name is not None:
            binaries.remember(name, driver().cc, lambda: cubin_of(compiled, driver().cc),
                              modules or (_module(kernel),))  # fmt: skip
        fmt = "@" + "".join(_format(t) for t in compiled.argument_types)
        return _Compiled(handle, struct.Struct(fmt))


def cubin_of(compiled, cc: tuple[int, int]) -> tuple[bytes, str]:
    """(cubin image, entry point) of a compiled Numba kernel overload for compute
    capability `cc`. Reads private Numba attributes: raises whatever they raise."""
    library = compiled._codelibrary
    image = library.get_cubin(cc=tuple(cc))
    image = getattr(image, "code", image)  # numba-cuda >= 0.2x: a cuda.core ObjectCode
    if isinstance(image, str):  # an ObjectCode may hold a file path instead
        with open(image, "rb") as f:
            image = f.read()
    return bytes(image), library._entry_name


def _binary(name: str, args: tuple) -> _Compiled | None:
    """The overload loaded from a shipped or cached binary, or None (none exists for
    it, for this GPU or these sources, or the driver refuses it)."""
    drv = driver()
    found = binaries.load(name, drv.cc)
    if found is None:
        return None
    try:
        handle = drv.function(*found)
    except CudaError:
        return None
    fmt = "@" + "".join(type_code(a) for a in args)
    return _Compiled(handle, struct.Struct(fmt), library_kernel=False)


def _dims(d) -> tuple:
    if type(d) is tuple and len(d) == 3 and all([type(v) is int for v in d]):
        return d
    if not isinstance(d, tuple | list):
        return (int(d), 1, 1)
    d = tuple(int(v) for v in d)
    return d + (1,) * (3 - len(d))


class _Batching(threading.local):
    active = None  # the calling thread's kernels.common.batching.Batching, if any


batch_state = _Batching()


def launch(kernel, grid, block, args: tuple, stream: int = 0, smem: int = 0) -> None:
    """Enqueue `kernel` (a Numba CUDA dispatcher, or a `kernels.common.refs.KernelRef`,
    which imports Numba only where its kernel does not ship) on `stream` with `args`
    and return without waiting: the one launch path of the package.

    args: DeviceArray (`kernels.common.devarray`), Python or NumPy scalars, tuples of them;
    each distinct combination of types compiles once (as Numba's dispatch would) and
    is then launched through the driver with its parameters packed in one buffer,
    a few microseconds of Python. grid and block: an int or a tuple of up to three.
    stream: a CUstream handle (`kernels.common.devarray.resolve_stream`). smem: dynamic
    shared memory in bytes (opted in above 48 KiB). On Numba's simulator the kernel
    runs through Numba (args are the simulator's arrays; streams are ignored; one
    launch at a time, as the simulator is not thread-safe).
    """
    if _checking.active:
        _check(kernel, args)
        return
    batching = batch_state.active
    if batching is not None:
        batching.launch(dispatcher_of(kernel), grid, block, args, stream, smem)
    else:
        _launch(kernel, grid, block, args, stream, smem)


def _launch(kernel, grid, block, args: tuple, stream: int, smem: int) -> None:
    if SIMULATOR:
        with compile_lock:  # the simulator swaps module globals while a kernel runs
            dispatcher_of(kernel)[grid, block, 0, smem](*args)
        return
    if not all([type(a) in _PLAIN for a in args]):
        args = tuple([as_device_array(a) if _is_array(a) else a for a in args])
    key = (kernel, tuple([_arg_key(a) for a in args]))
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = _compiled[key] = _compile(kernel, args)
    drv = driver()
    if smem > SMEM_DEFAULT:
        drv.opt_in_smem(compiled.handle, smem, library_kernel=compiled.library_kernel)
    grid, block, values = _dims(grid), _dims(block), _flatten(args, [])
    drv.launch(compiled.handle, grid, block, smem, stream, compiled.packer, values)
    recording = _recorder.active
    if recording is not None:
        recording.launched(compiled, grid, block, smem, args, values)


# Argument types launch passes as they are (anything else with an array interface is
# viewed as a DeviceArray first).
_PLAIN = frozenset({DeviceArray, int, float, bool, tuple, np.float32, np.float64, np.int32,
                    np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_})  # fmt: skip


def _is_array(a) -> bool:
    return hasattr(a, "__cuda_array_interface__")


# ------------------------------------------------------------ recorded launch sequences


class Recording:
    """The launches a launch function makes, recorded so that later calls with the
    same plan can repeat them on other arrays without running that function again
    (`Recipe`). Arrays are placed by address: inside one of the call's own arrays
    (its slots: the input, the output...), inside a pool allocation made while
    recording (scratch, allocated afresh on each replay), or anywhere else (a
    constant such as uploaded weights: kept alive by the recipe, passed as it is).
    An upload of host data while recording makes it not replayable."""

    def __init__(self, arrays: tuple) -> None:
        self.ranges = [(a.ptr, a.ptr + a.nbytes, slot) for slot, a in enumerate(arrays)]
        self.slots = len(arrays)
        self.scratch: list[int] = []
        self.steps: list[tuple] = []
        self.constants: list = []
        self.replayable = True

    def __enter__(self) -> Recording:
        if _recorder.active is not None:
            raise RuntimeError("launch recordings do not nest")
        _recorder.active = self
        return self

    def __exit__(self, *exc) -> None:
        _recorder.active = None

    def allocated(self, block) -> None:
        slot = self.slots + len(self.scratch)
        self.scratch.append(block.size)
        self.ranges.append((block.ptr, block.ptr + block.size, slot))

    def _place(self, ptr: int) -> tuple[int, int] | None:
        for lo, hi, slot in reversed(self.ranges):  # the latest allocation first
            if lo <= ptr < hi or ptr == lo:
                return slot, ptr - lo
        return None

    def launched(self, compiled, grid, block, smem, args, values) -> None:
        patches, i = [], 0
        for a in args:
            if type(a) is DeviceArray:
                place = self._place(a.ptr)
                if place is None:
                    self.constants.append(a)
                else:
                    patches.append((i + 4, *place))  # params()[4] is the data pointer
                i += 5 + 2 * len(a.shape)
            elif type(a) is tuple:
                if any(type(v) is DeviceArray for v in a):
                    self.replayable = False
                i += len(_flatten(a, []))
            else:
                i += 1
        step = (compiled.handle, grid, block, smem, compiled.packer, values, tuple(patches))
        self.steps.append(step)

    def recipe(self) -> Recipe | None:
        if not self.replayable or not self.steps:
            return None
        return Recipe(tuple(self.steps), tuple(self.scratch), tuple(self.constants))


class Recipe:
    """Recorded launches (`Recording`), replayed on new arrays with `replay`."""

    __slots__ = ("steps", "scratch", "constants", "_prepared")

    def __init__(self, steps: tuple, scratch: tuple, constants: tuple) -> None:
        self.steps, self.scratch, self.constants = steps, scratch, constants
        self._prepared = None

    def replay(self, pointers: list, stream: int) -> None:
        """Queue the launches on `stream` with the recorded slots at `pointers` (in
        the order the Recording was given its arrays) and fresh scratch."""
        if self.scratch:
            blocks = [POOL.allocate(n, stream) for n in self.scratch]
            bases = pointers + [b.ptr for b in blocks]
        else:
            bases = pointers
        prepared = self._prepared
        if prepared is None:
            prepared = self._prepared = prepare_steps(self.steps)
        for step in prepared:
            step.launch(stream, bases)


def prepare_steps(steps: tuple) -> tuple:
    """Recorded steps (handle, grid, block, smem, packer, values, patches; a patch is
    (parameter index, slot, byte offset)) as the driver's prepared launches, which
    patch only the pointers on each replay."""
    drv = driver()
    return tuple(drv.prepare(*step) for step in steps)


def launch_or_replay(key: tuple, slots: tuple, kernel, grid, block, args: tuple, stream: int,
                     smem: int = 0) -> None:  # fmt: skip
    """`launch`, recorded on a first call under `key` in `kernels.common.replay.TABLE`
    (`Recording` of the arrays `slots`), replayed on later calls with the same key on
    the slots' new pointers (a template copy and a driver call). `key` (its first item
    the operation's name) must hold everything but the slots' data pointers that
    shapes the launch's parameters (shapes, strides, dtypes, scalars)."""
    recipe = replay.TABLE.get(key)
    if recipe is not None:
        recipe.replay([a.ptr for a in slots], stream)
        return
    if SIMULATOR or _recorder.active is not None:
        launch(kernel, grid, block, args, stream, smem)  # nothing to record / recorded outside
        return
    with Recording(slots) as recording:
        launch(kernel, grid, block, args, stream, smem)
    recipe = recording.recipe()
    if recipe is not None:
        replay.keep(key, recipe)
