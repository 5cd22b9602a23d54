"""Launch geometry shared by the image kernels."""

from __future__ import annotations

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


_SCRATCH: dict = {}
_SCRATCH_KEEP = 4


def scratch(shape: tuple, dtype, tag: str = ""):
    """A device work buffer of this shape and dtype, reused across calls.

    cudaMalloc and cudaFree cost far more than a fast filter; launches on the
    default stream run in order, so one buffer per (shape, dtype, tag) is safe to
    reuse; a caller needing two at once gives them different tags. Keeps the most
    recent few.
    """
    from numba import cuda

    key = (tuple(shape), str(dtype), tag)
    buf = _SCRATCH.pop(key, None)
    if buf is None:
        buf = cuda.device_array(shape, dtype=dtype)
    _SCRATCH[key] = buf
    while len(_SCRATCH) > _SCRATCH_KEEP:
        _SCRATCH.pop(next(iter(_SCRATCH)))
    return buf


# ------------------------------------------------------- row-wise kernels (softmax, GEMV)

WAVES = 32  # OneFlow's GetNumBlocks: enough blocks for this many full waves


def device_limits() -> tuple[int, int]:
    """(SM count, max resident threads per SM) of the current device."""
    from numba import cuda

    dev = cuda.get_current_device()
    return int(dev.MULTIPROCESSOR_COUNT), int(dev.MAX_THREADS_PER_MULTIPROCESSOR)


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


# ------------------------------------------------- direct launches (per-call cost)


def direct_launcher(configured, args, sharedmem: int = 0):
    """A launch function for a kernel whose array arguments change from call to call.

    `configured` is `kernel[grid, block]` (or with stream and shared memory), just
    launched with `args` through Numba (so the kernel is compiled for their types).
    The returned `launch(*arrays)` passes Numba device arrays of the same types
    straight to cuda.core's launch (`core_launcher`), skipping Numba's per-call
    dispatch (argument typing, overload lookup, launch-config bookkeeping): about half
    of Numba's Python cost per launch. Only arrays are supported. Returns None where
    this numba-cuda has no such path (older releases, the simulator, a debug kernel):
    callers then keep using `configured`.
    """
    if not all(hasattr(a, "device_ctypes_pointer") for a in args):
        return None
    try:
        grid, block, stream = configured.griddim, configured.blockdim, configured.stream
    except AttributeError:
        return None
    core = core_launcher(configured.dispatcher, args, grid, block, sharedmem, stream)
    if core is None:
        return None

    def launch(*arrays):
        kargs = []
        for a in arrays:
            ptr = a.device_ctypes_pointer.value or 0
            kargs += (0, 0, a.size, a.dtype.itemsize, ptr, *a.shape, *a.strides)
        core(*kargs)

    return launch


def flat_array_args(ptr: int, nitems: int, itemsize: int) -> tuple:
    """A 1-D C-contiguous device array argument as Numba passes it to a kernel
    (meminfo, parent, size, itemsize, data, shape, strides), for `core_launcher`."""
    return (0, 0, nitems, itemsize, ptr, nitems, itemsize)


def core_launcher(dispatcher, args: tuple, grid: tuple, block, sharedmem: int = 0, stream=0):
    """`launch(*kernelargs)` of the overload of `dispatcher` that `args` (just launched
    through Numba, so compiled) select, with this grid, block (an int or a tuple),
    dynamic shared memory and stream (0: the default one). It takes the arguments
    already flattened as Numba flattens them (arrays: `flat_array_args`; integers:
    ctypes.c_int64) and hands them to cuda.core's launch, skipping Numba's dispatch
    and the array views a caller would build for it. None where this numba-cuda has no
    such path (the simulator, older releases, debug kernels): callers keep launching
    through Numba.
    """
    try:
        from numba.cuda import dispatcher as nd
        from numba.cuda.cudadrv import driver

        core_stream = driver._to_core_stream(stream)
        types = tuple(dispatcher.typeof_pyval(a) for a in args)
        overload = dispatcher.overloads[types]
        if overload.debug or overload.cooperative or getattr(overload, "extensions", None):
            return None
        block = (block,) if isinstance(block, int) else tuple(block)
        coop = "is_cooperative" if nd.CUDA_CORE_GE_1_0 else "cooperative_launch"
        cfg = nd.LaunchConfig(
            grid=tuple(grid) + (1,) * (3 - len(grid)),
            block=block + (1,) * (3 - len(block)),
            shmem_size=sharedmem,
            **{coop: False},
        )
        kern = overload._codelibrary.get_cufunc().kernel
        core_launch = nd.launch
    except Exception:  # noqa: BLE001 - private numba-cuda attributes may change
        return None

    def launch(*kernelargs):
        core_launch(core_stream, cfg, kern, *kernelargs)

    return launch
