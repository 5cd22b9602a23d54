"""Every recorded launch sequence, in one table, and the replay of whole device calls.

A pipeline calls one operation on device arrays of one shape, call after call. The
first call checks, plans and records its launches (`kernels.common.launch.Recording`:
a `Recipe` patched with new pointers on a replay); every later call with the same key
replays them. One table (`TABLE`, at most `KEEP` entries, the oldest dropped first)
holds every operation's records, under keys whose first item says whose they are:

- ``("recipe", ...)``: an image operation's launches, keyed by its options, the
  image's shape, dtype and alignments and the stream (`imgfilter.backends.cuda`);
  ``("lists", ...)`` a list's var-shape launches; ``("softmax", ...)``,
  ``("gemv", ...)`` those kernels' launches (`launch_or_replay`).
- ``("call", ...)``: a whole `blur` / `filter2d` / `contour` call on a device image
  with no `out` (`lookup`, filed by `note` and `remember`): its options, the image's
  layout and address mod 16 as `kernels.common.devarray.peek` reads them, and the
  stream. A hit skips the checks and the plan: a new output and the recorded
  launches, a few microseconds of Python. ``("softmax call", ...)`` and
  ``("gemv call", ...)`` are the same for those entry points (`keep_call`).

Lookups read the dict without a lock (one atomic `get`); writes hold `_lock`.
"""

from __future__ import annotations

import threading
from typing import Any

from .devarray import (
    DeviceArray,
    c_array,
    cheap_view,
    empty_like,
    native_empty,
    peek,
    stream_handle,
)

TABLE: dict[tuple, Any] = {}
KEEP = 512
_lock = threading.Lock()


def keep(key: tuple, value: Any) -> None:
    """File `value` under `key`, dropping the oldest entries past `KEEP`."""
    with _lock:
        while len(TABLE) >= KEEP:
            TABLE.pop(next(iter(TABLE)), None)
        TABLE[key] = value


def clear() -> None:
    """Forget every record (their scratch buffers go back to the pool)."""
    with _lock:
        TABLE.clear()


def keep_call(key: tuple, out: DeviceArray, recipe) -> None:
    """File a whole call under `key`: its recipe and a template of its result."""
    keep(key, (recipe, c_array(0, out.shape, out.dtype, 0, None)))


class _Last(threading.local):
    seen = None  # (image address, output address, recipe) of this thread's last launch


_last = _Last()


def _call_key(options: tuple, seen: tuple, stream: Any) -> tuple[tuple, int]:
    layout, ptr, own_stream = seen
    handle = own_stream if stream is None else stream_handle(stream)
    return ("call", options, layout, ptr & 15, handle), handle


def lookup(options: tuple, img: Any, stream: Any) -> Any:
    """The result of a call seen before (queued on its stream), or None: the caller
    takes the general path, which this resets the backend's note for. The result is
    of the image's library, as the general path's (`native_empty`), else ours.
    CUDA failures raise `CudaError` / `GpuOutOfMemory` (the caller words them).

    options: hashable, naming the function and every option that shapes its launches.
    img: the call's image, as given. stream: the call's `stream=`, as given."""
    _last.seen = None
    seen = peek(img, stream is None)
    if seen is None:
        return None
    try:
        key, handle = _call_key(options, seen, stream)
        hit = TABLE.get(key)
    except (TypeError, ValueError):  # an unhashable option or a bad stream: the general
        return None  # path says what is wrong
    if hit is None:
        return None
    recipe, template = hit
    out = native_empty(img, template.shape, template.dtype)
    if out is None:
        out = empty_like(template, handle)
        ptr = out.ptr
    elif (ptr := peek(out, False)[1]) & 511:  # not aligned as the recording was
        return None
    recipe.replay([seen[1], ptr], handle)
    return out


def note(img: DeviceArray, out: DeviceArray, recipe) -> None:
    """Called by the backend: this thread's last device launch sequence, made as
    `recipe` on img into out."""
    _last.seen = (img.ptr, out.ptr, recipe) if recipe is not None else None


def remember(options: tuple, img: Any, stream: Any, result: Any) -> None:
    """File the recipe the backend noted for this call, when it made the whole call:
    the noted addresses are the call's image and its (pool-allocated) result."""
    seen = _last.seen
    _last.seen = None
    view = None if seen is None else cheap_view(result)
    if view is None:
        return
    peeked = peek(img, stream is None)
    if peeked is None or seen[0] != peeked[1] or seen[1] != view.ptr or view.ptr & 511:
        return
    try:
        key, _ = _call_key(options, peeked, stream)
        hash(key)
    except (TypeError, ValueError):
        return
    keep_call(key, view, seen[2])
