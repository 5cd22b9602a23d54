"""Images of different sizes in one launch per kernel (lists of images).

`Collecting` notes the launches that each image's launch function makes;
`var_shape_plan` groups images whose launches match and makes each step one launch of
the kernel's var-shape form (`var_shape_kernel`: blockIdx.z picks the image, a table
gives each image's grid, arrays and integers), where `kernels.common.launch.mergeable`
allows; `run_var_shape` queues the plan and `VarShapeRecipe` replays it on other images
of the same shapes. Same results as each image alone: the body is the kernel's own
source.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools

import numpy as np

from . import shipped
from .arrays import (
    SPACE_BASE,
    address_space,
    as_device_array,
    empty,
    extent,
    is_c_contiguous,
    is_device_array,
    start_address,
    to_device,
)
from .batching import TARGET_OPTIONS, device_body, jit_like, mergeable
from .cudadrv import address, driver
from .devarray import POOL, DeviceArray, _recorder
from .launch import (
    SIMULATOR,
    _arg_key,
    _compile,
    _compiled,
    _dims,
    _flatten,
    _is_array,
    _launch,
    batch_state,
    compile_lock,
    prepare_steps,
    type_name,
)
from .refs import key_of, stable_text

# Argument types passed to a var-shape launch per image through its table (the
# others must be equal for every image that a launch merges).
_INTS = frozenset({int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                   np.uint64})  # fmt: skip


class Collecting:
    """While active in a thread, `launch` notes each launch of the launch functions
    run meanwhile as (kernel, grid, block, args, smem) instead of making it, and
    `scratch` notes the buffers it gives (`buffers`): one image's launches, for
    `var_shape_plan` to make for many images at once. An upload of host data
    meanwhile (weights) clears `replayable`, as in a `Recording`."""

    def __init__(self) -> None:
        self.steps: list[tuple] = []
        self.buffers: list = []
        self.replayable = True

    def __enter__(self) -> Collecting:
        if batch_state.active is not None or _recorder.active:
            raise RuntimeError("launch collections do not nest")
        batch_state.active = self
        _recorder.active = self
        return self

    def __exit__(self, *exc) -> None:
        batch_state.active = None
        _recorder.active = None

    def allocated(self, block) -> None:
        """The pool's hook for recorders: buffers are noted by `scratch`."""

    def scratch(self, shape: tuple, dtype, stream: int):
        buffer = empty(shape, dtype, stream)
        self.buffers.append(buffer)
        return buffer

    def launch(self, kernel, grid, block, args: tuple, stream: int, smem: int) -> None:
        if not SIMULATOR:
            args = tuple([as_device_array(a) if _is_array(a) else a for a in args])
        self.steps.append((kernel, _dims(grid), _dims(block), args, smem))


def _device_arg_key(a) -> tuple:
    """A device array's type as a kernel parameter: dtype number, rank, layout."""
    if type(a) is DeviceArray:
        return a._sig
    return (np.dtype(a.dtype).num, len(a.shape), "C" if is_c_contiguous(a) else "A")


def _var_arg_key(a):
    """What must be equal in an argument for one launch to serve several images: an
    integer's type (its value goes in the table), an array's type (its address and
    shape too), a tuple's arrays by address, anything else by value."""
    t = type(a)
    if t in _INTS:
        return t
    if t is tuple:
        return tuple([(start_address(v), v.shape) if _is_device(v) else (type(v), v) for v in a])
    if t is DeviceArray or _is_device(a):
        return _device_arg_key(a)
    return (t, a)


def _is_device(a) -> bool:
    return type(a) is DeviceArray or (hasattr(a, "shape") and is_device_array(a))


def _same_array(a, b) -> bool:
    return (start_address(a) == start_address(b) and tuple(a.shape) == tuple(b.shape)
            and tuple(a.strides) == tuple(b.strides))  # fmt: skip


def _kinds(steps: list) -> tuple | None:
    """How each argument of one launch step, made for several images (`steps`, one per
    image, equal by `_var_arg_key`), reaches a merged launch: ("shared",) as it is,
    ("array", ndim) from the image's row of the table (per-image arrays, C-contiguous,
    element-aligned), ("int", type) likewise; None where the step cannot be merged (one
    image, a grid using z, a kernel without Python source or reading its grid size,
    per-image arrays inside tuples or not C-contiguous)."""
    kernel, grid, _, args, _ = steps[0]
    if not 1 < len(steps) <= 65535 or not mergeable(kernel):
        return None
    if any(s[1][2] != 1 for s in steps):
        return None
    kinds = []
    for p, a in enumerate(args):
        column = [s[3][p] for s in steps]
        t = type(a)
        if t in _INTS:
            kinds.append(("int", int if t is int else t))
        elif t is tuple or not _is_device(a):
            kinds.append(("shared",))  # equal by the step key
        elif all(_same_array(a, b) for b in column[1:]):
            kinds.append(("shared",))
        elif all(is_c_contiguous(b) and start_address(b) % b.dtype.itemsize == 0 for b in column):
            kinds.append(("array", len(a.shape)))
        else:
            return None
    return tuple(kinds)


def var_shape_plan(collected: list) -> list:
    """The launches that make every image's collected launches (`Collecting`; one list
    per image), as few as the images allow: images whose launches are the same kernels
    with the same blocks, argument types and non-integer scalars (equal plans: the
    usual case for images of one dtype and channel count) form a group, and each of a
    group's launch steps becomes one launch of the kernel's var-shape form
    (`var_shape_kernel`: blockIdx.z picks the image) where `_kinds` allows, else one
    launch per image. Items: ("many", image indices, steps, kinds) or ("one", image
    index, step). The count depends on the groups and steps, not on the images."""
    groups: dict = {}
    for i, steps in enumerate(collected):
        key = tuple([(s[0], s[2], s[1][2], tuple([_var_arg_key(a) for a in s[3]]))
                     for s in steps])  # fmt: skip
        groups.setdefault(key, []).append(i)
    plan: list = []
    for images in groups.values():
        for j in range(len(collected[images[0]])):
            steps = [collected[i][j] for i in images]
            kinds = _kinds(steps)
            if kinds is None:
                plan.extend(("one", i, step) for i, step in zip(images, steps, strict=True))
            else:
                plan.append(("many", tuple(images), steps, kinds))
    return plan


_var_kernels: dict = {}


def var_shape_kernel(kernel, kinds: tuple):
    """The kernel run once per image of a list of images of different sizes, in one
    launch: image b's blocks are those with blockIdx.z == b; those past the image's
    own grid (x, y; the launch's grid is the largest image's) return at once. Its
    first parameter is the table, one row per image: the image's grid x and y, then
    for each argument of kind ("array", ndim) the element offset of the image's array
    in the address space passed for it and its shape, for ("int", type) its value.
    The body is the kernel's own Python source, compiled as a device function: the
    same code, so the same results, as the single-image kernel."""
    key = (kernel, kinds)
    with compile_lock:
        found = _var_kernels.get(key)
        if found is not None:
            return found
        from numba import cuda

        namespace = {"cuda": cuda, "body": device_body(kernel)}
        params, lines, call, col = ["t"], [], [], 2
        for p, kind in enumerate(kinds):
            if kind[0] == "shared":
                params.append(f"a{p}")
                call.append(f"a{p}")
            elif kind[0] == "array":
                dims = [f"r[{col + 1 + d}]" for d in range(kind[1])]
                params.append(f"a{p}")
                lines.append(f"o{p} = r[{col}]")
                size, shape = " * ".join(dims), ", ".join(dims)
                lines.append(f"v{p} = a{p}[o{p} : o{p} + {size}].reshape(({shape},))")
                call.append(f"v{p}")
                col += 1 + kind[1]
            else:
                namespace[f"T{p}"] = kind[1]
                lines.append(f"s{p} = T{p}(r[{col}])")
                call.append(f"s{p}")
                col += 1
        source = "\n    ".join([
            f"def var_shape({', '.join(params)}):",
            "b = cuda.blockIdx.z",
            "r = t[b]",
            "if cuda.blockIdx.x >= r[0] or cuda.blockIdx.y >= r[1]:",
            "    return",
            *lines,
            f"body({', '.join(call)})",
        ]) + "\n"  # fmt: skip
        exec(compile(source, f"<var-shape {kernel.py_func.__name__}>", "exec"), namespace)
        found = _var_kernels[key] = jit_like(kernel, namespace["var_shape"])
        _var_sources[found] = (kernel, kinds, source)
        return found


_var_sources: dict = {}  # var-shape kernel -> (its kernel, kinds, generated source)


def cubin_name(var_kernel, args: tuple) -> str | None:
    """A name for `var_kernel`'s overload for `args` (a var-shape kernel, its launch
    arguments) the same in every process: "var_shape-" and a hash of its kernel's
    `refs.key_of` name and options, its kinds, its generated source and the
    argument types; None where there is none (a kernel without a stable key, a tuple
    argument). What the kernel's sources are is left to `kernels.common.binaries`."""
    kernel, kinds, source = _var_sources[var_kernel]
    key = key_of(kernel)
    names = [type_name(a) for a in args]
    if key is None or None in names or any(type(a) is tuple for a in args):
        return None
    options = getattr(kernel, "targetoptions", {})
    chosen = repr([(k, repr(options[k])) for k in TARGET_OPTIONS if k in options])
    parts = [key, stable_text(kinds), source, ",".join(names), chosen]
    if None in parts:
        return None
    return "var_shape-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def _loaded(kernel, kinds: tuple, args: tuple):
    """The var-shape form of `kernel` for `kinds` (`var_shape_kernel`), its overload
    for `args` ready to launch: compiled, or loaded from the kernel binaries
    (`kernels.common.binaries`: one an earlier process compiled, or one shipped), else
    compiled and kept there. Generated kernels have no source file, so Numba's own
    cache cannot keep them; their binaries are checked against every `kernels` module."""
    var_kernel = var_shape_kernel(kernel, kinds)
    if SIMULATOR:
        return var_kernel
    key = (var_kernel, tuple([_arg_key(a) for a in args]))
    with compile_lock:
        if key not in _compiled:
            name = cubin_name(var_kernel, args)
            _compiled[key] = _compile(var_kernel, args, name, shipped.all_modules())
    return var_kernel


def _table_columns(kinds: tuple) -> int:
    return 2 + sum(1 + k[1] if k[0] == "array" else 1 if k[0] == "int" else 0 for k in kinds)


def _fill_rows(rows: np.ndarray, steps: list, kinds: tuple, bases: list) -> None:
    """Write a merged launch's table rows (one per image, see `var_shape_kernel`);
    bases[p]: the address element 0 of argument p's address space stands at. A
    column at a time (the arrays of a column share their dtype and rank)."""
    rows[:, :2] = [s[1][:2] for s in steps]
    col = 2
    for p, kind in enumerate(kinds):
        if kind[0] == "array":
            column = [s[3][p] for s in steps]
            itemsize = column[0].dtype.itemsize
            rows[:, col] = [(start_address(a) - bases[p]) // itemsize for a in column]
            rows[:, col + 1 : col + 1 + kind[1]] = [tuple(a.shape) for a in column]
            col += 1 + kind[1]
        elif kind[0] == "int":
            rows[:, col] = [int(s[3][p]) for s in steps]
            col += 1


def run_var_shape(plan: list, stream: int) -> None:
    """Queue a `var_shape_plan` on `stream` with the arrays it was collected with:
    the merged launches' table uploaded once (one row block per merged launch), then
    every launch in order; the var-shape kernels loaded or compiled (`_loaded`)."""
    merged = [item for item in plan if item[0] == "many"]
    widths = [_table_columns(item[3]) for item in merged]
    table = np.zeros((sum(len(item[1]) for item in merged), max(widths, default=2)), np.int64)
    launches, row0 = [], 0
    for item, width in zip(merged, widths, strict=True):
        _, images, steps, kinds = item
        spaces = [_address_space(kinds, p, steps) for p in range(len(kinds))]
        bases = [None if s is None else s[1] for s in spaces]
        _fill_rows(table[row0 : row0 + len(images), :width], steps, kinds, bases)
        launches.append((row0, len(images), [None if s is None else s[0] for s in spaces]))
        row0 += len(images)
    dtable = to_device(table, stream) if merged else None
    made = iter(launches)
    for item in plan:
        if item[0] == "one":
            kernel, grid, block, args, smem = item[2]
            _launch(kernel, grid, block, args, stream, smem)
            continue
        _, images, steps, kinds = item
        row0, n, spaces = next(made)
        kernel, _, block, args, _ = steps[0]
        grid = (max(s[1][0] for s in steps), max(s[1][1] for s in steps), n)
        smem = max(s[4] for s in steps)
        params = [dtable[row0 : row0 + n]]
        for p, kind in enumerate(kinds):
            if kind[0] == "shared":
                params.append(args[p])
            elif kind[0] == "array":
                params.append(spaces[p])
        params = tuple(params)
        _launch(_loaded(kernel, kinds, params), grid, block, params, stream, smem)


def _address_space(kinds: tuple, p: int, steps: list):
    """(array, base) for argument p of a merged launch when it is per-image: a 1-D
    array of its dtype whose element 0 is at `base`, over every image's array."""
    if kinds[p][0] != "array":
        return None
    column = [s[3][p] for s in steps]
    return address_space(column[0].dtype, [extent(a) for a in column])


def _prepared(kernel, args: tuple) -> tuple:
    """(compiled overload, flat parameter values) of a launch, compiling it if new."""
    key = (kernel, tuple([_arg_key(a) for a in args]))
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = _compiled[key] = _compile(kernel, args)
    return compiled, _flatten(args, [])


def _places(args: tuple, place) -> list | None:
    """(parameter index of its data pointer, slot, byte offset) of each array argument
    that `place(address)` puts in a slot ((slot, offset) or None); None when an array
    inside a tuple lies in a slot or `place` refuses one (False)."""
    patches, i = [], 0
    for a in args:
        if type(a) is DeviceArray:
            found = place(a.ptr)
            if found is False:
                return None
            if found is not None:
                patches.append((i + 4, *found))  # params()[4] is the data pointer
            i += 5 + 2 * len(a.shape)
        elif type(a) is tuple:
            if any(type(v) is DeviceArray and place(v.ptr) is not None for v in a):
                return None
            i += len(_flatten(a, []))
        else:
            i += 1
    return patches


class _Slots:
    """The arrays of a var-shape call that change from call to call, by address:
    slot 0 the table, then each image's input, output and scratch buffers. An image's
    arrays are looked for among its own slots first, so a list that holds one image
    twice is placed (and replayed) as well as any other."""

    def __init__(self, images: list) -> None:
        self.own: list = []  # per image: its (first, past, slot)s
        self.given: list = []  # the slots of input 0, output 0, input 1, ...
        self.scratch: list = []  # (slot, byte offset in one allocation)
        self.scratch_bytes = 0
        slot = 1
        for src, dst, buffers in images:
            mine = []
            for j, a in enumerate((src, dst, *buffers)):
                lo, hi = extent(a)
                mine.append((lo, hi, slot))
                if j < 2:
                    self.given.append(slot)
                else:
                    self.scratch.append((slot, self.scratch_bytes))
                    self.scratch_bytes += -(-max(hi - lo, 1) // 256) * 256
                slot += 1
            self.own.append(tuple(mine))
        self.count = slot
        ranges = sorted(r for mine in self.own for r in mine)
        self._firsts = [r[0] for r in ranges]
        self._reach = list(itertools.accumulate((r[1] for r in ranges), max))

    def _in_any(self, ptr: int) -> bool:
        """Whether `ptr` lies in some slot (or starts an empty one)."""
        k = bisect.bisect_right(self._firsts, ptr) - 1
        return k >= 0 and (self._reach[k] > ptr or self._firsts[k] == ptr)

    def placer(self, image: int | None):
        """place(address): (slot, offset) inside one of image's slots, else False
        inside another image's (or, for image None, any slot), else None."""
        own = () if image is None else self.own[image]

        def place(ptr: int):
            for lo, hi, slot in own:
                if lo <= ptr < hi or ptr == lo:
                    return slot, ptr - lo
            return False if self._in_any(ptr) else None

        return place


class VarShapeRecipe:
    """A `var_shape_plan`, replayed on other images of the same shapes, dtypes and
    alignments (`replay`): new input and output addresses, fresh scratch (one pool
    allocation), the table's address columns recomputed and uploaded, the recorded
    launches patched and made. `build` gives None when the plan cannot be replayed
    (an image's launch takes an array in another image's memory)."""

    __slots__ = ("slots", "table", "addresses", "steps", "constants", "_prepared")

    @classmethod
    def build(cls, plan: list, images: list) -> VarShapeRecipe | None:
        """images[i]: (input, output, scratch buffers) of image i, as collected."""
        self = cls()
        self._prepared = None
        self.slots = _Slots(images)
        merged = [item for item in plan if item[0] == "many"]
        widths = [_table_columns(item[3]) for item in merged]
        self.table = np.zeros((sum(len(m[1]) for m in merged), max(widths, default=2)), np.int64)
        self.steps, self.constants, addresses, row0 = [], [], [], 0
        for item in plan:
            if item[0] == "one":
                step = self._one(item)
            else:
                step = self._many(item, row0, addresses)
                row0 += len(item[1])
            if step is None:
                return None
            self.steps.append(step)
        self.addresses = tuple(np.array(c, np.int64) for c in zip(*addresses, strict=True))
        return self

    def _one(self, item: tuple) -> tuple | None:
        """The recorded launch of one image's step (its arrays patched by slot)."""
        _, image, (kernel, grid, block, args, smem) = item
        return self._step(kernel, grid, block, args, smem, self.slots.placer(image), [])

    def _many(self, item: tuple, row0: int, addresses: list) -> tuple | None:
        """The recorded merged launch of a step: its table rows filled (addresses
        noted for `replay`), the table view patched to the uploaded table."""
        _, images, steps, kinds = item
        n, width = len(images), self.table.shape[1]
        _fill_rows(self.table[row0 : row0 + n], steps, kinds, [SPACE_BASE] * len(kinds))
        for b, (image, step) in enumerate(zip(images, steps, strict=True)):
            place, col = self.slots.placer(image), 2
            for p, kind in enumerate(kinds):
                if kind[0] == "array":
                    found = place(start_address(step[3][p]))
                    if not found:
                        return None
                    addresses.append((row0 + b, col, *found, step[3][p].dtype.itemsize))
                    col += 1 + kind[1]
                elif kind[0] == "int":
                    col += 1
        kernel, _, block, first, _ = steps[0]
        grid = (max(s[1][0] for s in steps), max(s[1][1] for s in steps), n)
        smem = max(s[4] for s in steps)
        params = [DeviceArray(0, (n, width), np.int64)]  # patched to the table's rows
        for p, kind in enumerate(kinds):
            if kind[0] == "shared":
                params.append(first[p])
            elif kind[0] == "array":
                params.append(address_space(first[p].dtype, [])[0])
        table_rows = [(4, 0, row0 * width * 8)]
        return self._step(var_shape_kernel(kernel, kinds), grid, block, tuple(params), smem,
                          self.slots.placer(None), table_rows)  # fmt: skip

    def _step(self, kernel, grid, block, args: tuple, smem: int, place, patches: list):
        found = _places(args[len(patches) > 0 :], place)
        if found is None:
            return None
        shift = 9 if patches else 0  # the table's parameters come first
        patches = patches + [(index + shift, slot, at) for index, slot, at in found]
        self.constants += [a for a in args if type(a) is DeviceArray and place(a.ptr) is None]
        compiled, values = _prepared(kernel, args)
        return (compiled.handle, _dims(grid), _dims(block), smem, compiled.packer, values,
                tuple(patches))  # fmt: skip

    def replay(self, given: list, stream: int) -> None:
        """Queue the launches on `stream` for new images: `given` the addresses of
        each image's input and output (input 0, output 0, input 1, ...)."""
        slots = self.slots
        bases = [0] * slots.count
        for slot, ptr in zip(slots.given, given, strict=True):
            bases[slot] = ptr
        if slots.scratch_bytes:
            block = POOL.allocate(slots.scratch_bytes, stream)
            for slot, at in slots.scratch:
                bases[slot] = block.ptr + at
        drv = driver()
        if self.table.size:
            table = self.table.copy()
            if self.addresses:
                rows, cols, where, offsets, itemsizes = self.addresses
                at = np.array(bases, dtype=np.int64)[where] + offsets - SPACE_BASE
                table[rows, cols] = at // itemsizes
            held = POOL.allocate(table.nbytes, stream)
            drv.upload(held.ptr, address(table), table.nbytes, stream)
            bases[0] = held.ptr
        prepared = self._prepared
        if prepared is None:
            prepared = self._prepared = prepare_steps(self.steps)
        for step in prepared:
            step.launch(stream, bases)
