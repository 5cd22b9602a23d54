"""Batches in one launch: the launches a launch function makes for a batch's first
image, made for every image (`Batching`), as one launch of the kernel's batched form
(`batched_kernel`) where the kernel allows it. Also the kernel-body helpers the
var-shape launches of lists share (`mergeable`, `device_body`, `jit_like`)."""

from __future__ import annotations

import numpy as np

from .arrays import as_device_array, batched_view, empty, extent, is_c_contiguous, is_device_array
from .launch import SIMULATOR, _dims, _is_array, _launch, batch_state, cdiv, compile_lock

# ------------------------------------------------------------ batches in one launch


_batched: dict = {}
TARGET_OPTIONS = ("launch_bounds", "max_registers", "fastmath", "lineinfo", "opt")


def batched_kernel(kernel, per_image: tuple):
    """The kernel run once per image of a batch, in one launch: image b's blocks are
    those with blockIdx.z == b, and array argument i (where per_image[i]) arrives as
    the batch's arrays (N, ...) of which the kernel's body gets the b-th. The body is
    the kernel's own Python source compiled as a device function: the same code as
    the single-image kernel, for kernels that do not use blockIdx.z themselves
    (`mergeable`)."""
    key = (kernel, per_image)
    with compile_lock:
        found = _batched.get(key)
        if found is not None:
            return found
        from numba import cuda, uint64

        names = [f"a{i}" for i in range(len(per_image))]
        call = ", ".join(f"{n}[b]" if batch else n for n, batch in zip(names, per_image,
                                                                        strict=True))  # fmt: skip
        # b unsigned: Numba indexes with a signed integer through a negative-index wrap.
        namespace = {"cuda": cuda, "uint64": uint64, "body": device_body(kernel)}
        source = (
            f"def batched({', '.join(names)}):\n    b = uint64(cuda.blockIdx.z)\n    body({call})\n"
        )
        exec(compile(source, f"<batched {kernel.py_func.__name__}>", "exec"), namespace)
        found = _batched[key] = jit_like(kernel, namespace["batched"])
        return found


class Batching:
    """While active in a thread, the launches that a launch function makes for the
    first image of a batch are made for every image: as one launch of the kernel's
    batched form (`batched_kernel`) where the kernel's grid leaves z free and every
    per-image array repeats at a fixed step as a C-contiguous whole, else one launch
    per image. An array argument is per-image when it lies inside one of the first
    image's arrays (given with the byte step to the next image's) or inside a
    `scratch` buffer taken meanwhile (one per image); any other array (weights) is
    shared by all images."""

    def __init__(self, n: int, firsts: tuple) -> None:
        self.n = n
        self.ranges = [(*extent(a), step) for a, step in firsts]

    def __enter__(self) -> Batching:
        if batch_state.active is not None:
            raise RuntimeError("batches do not nest")
        batch_state.active = self
        return self

    def __exit__(self, *exc) -> None:
        batch_state.active = None

    def scratch(self, shape: tuple, dtype, stream: int):
        """The first image's buffer; the others follow at a step of its size
        rounded up to 16 bytes (every image's buffer aligned as the first's)."""
        dtype = np.dtype(dtype)
        size = int(np.prod(shape))
        step = cdiv(max(size * dtype.itemsize, 1), 16) * 16
        whole = empty((self.n * step // dtype.itemsize,), dtype, stream)
        first = whole[:size].reshape(shape)
        lo = extent(first)[0]
        self.ranges.append((lo, lo + step, step))
        return first

    def _step(self, a) -> int | None:
        """The byte step from image to image of a per-image array, None if shared."""
        if not is_device_array(a):
            return None
        lo, hi = extent(a)
        for first, past, step in self.ranges:
            if first <= lo < past:
                if hi > past:
                    raise ValueError("a launch argument reaches past the batch's first image")
                return step
        return None

    def _one_launch(self, a, step) -> bool:
        """Whether the per-image array `a` can be passed as one (N, ...) array."""
        if isinstance(a, tuple):
            return all(self._step(v) is None for v in a)
        if step is None:
            return True
        lo, hi = extent(a)
        return is_c_contiguous(a) and hi - lo == step

    def launch(self, kernel, grid, block, args: tuple, stream: int, smem: int) -> None:
        if not SIMULATOR:
            args = tuple([as_device_array(a) if _is_array(a) else a for a in args])
        steps = [None if isinstance(a, tuple) else self._step(a) for a in args]
        grid = _dims(grid)
        pairs = list(zip(args, steps, strict=True))
        views = [a if s is None else batched_view(a, self.n, s) for a, s in pairs]
        together = grid[2] == 1 and self.n <= 65535 and mergeable(kernel)
        per_image = tuple(s is not None for s in steps)
        if not any(per_image):  # the same for every image: once
            _launch(kernel, grid, block, args, stream, smem)
            return
        if together and all(self._one_launch(a, s) for a, s in pairs):
            _launch(batched_kernel(kernel, per_image), (grid[0], grid[1], self.n), block,
                    tuple(views), stream, smem)  # fmt: skip
            return
        for i in range(self.n):
            one = [
                self._shifted(v, i) if s is None else v[i]
                for v, s in zip(views, steps, strict=True)
            ]
            _launch(kernel, grid, block, tuple(one), stream, smem)

    def _shifted(self, a, i: int):
        """Image i's version of a tuple argument (its per-image arrays moved)."""
        if not isinstance(a, tuple):
            return a
        return tuple(v if (s := self._step(v)) is None else batched_view(v, self.n, s)[i]
                     for v in a)  # fmt: skip


# ------------------------------------------------- one kernel body, several images


def mergeable(kernel) -> bool:
    """Whether a kernel's launches for several images can be one launch whose
    blockIdx.z picks the image: it has Python source and reads neither the grid's size
    (a merged grid is the largest image's) nor blockIdx.z (the generic kernels take
    their channel from it, even with one channel)."""
    if not hasattr(kernel, "py_func"):
        return False
    names = kernel.py_func.__code__.co_names
    reads_z = "blockIdx" in names and "z" in names
    return not (reads_z or "gridDim" in names or "gridsize" in names)


_bodies: dict = {}


def device_body(kernel):
    """The kernel's Python function compiled as a device function (shared by the
    batched and var-shape forms)."""
    body = _bodies.get(kernel)
    if body is None:
        from numba import cuda

        body = _bodies[kernel] = cuda.jit(device=True)(kernel.py_func)
    return body


def jit_like(kernel, function):
    """`function` compiled as a kernel with `kernel`'s launch bounds and options."""
    from numba import cuda

    options = getattr(kernel, "targetoptions", {})
    return cuda.jit(**{k: options[k] for k in TARGET_OPTIONS if k in options})(function)
