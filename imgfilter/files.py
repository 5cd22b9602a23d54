"""Many files in one command: inputs expanded, outputs planned, a bounded pipeline.

    entries, problems = expand(["photos/", "*.png", "one.jpg"], recursive=True)
    plan = make_plan(entries, op="blur", out_dir=Path("out"), template="{stem}.blur{ext}")
    stats = run_pipeline(plan.jobs, load=..., compute=..., save=..., workers=8)

`expand` turns command-line arguments into files: a directory gives the images inside
it (its subdirectories too with `recursive`), a pattern that names no file is expanded
here (for shells that do not expand globs), anything else is taken as a file name.
`make_plan` gives each file its output path and finds, before any work starts, two
inputs that would write the same output and an output that would replace an input.

`run_pipeline` runs `load` (read and decode) and `save` (encode and write) on a pool of
`workers` threads. Where `compute` (the filter) runs is chosen per image: on the codec
thread that decoded it, straight after the read and before the write, when `here(job,
loaded)` says so (a filter cheap next to decoding and encoding, as a plain cv2 thread
pool runs it: no hop to another thread); else in the calling thread, one image at a
time (filters=1: a CPU filter that uses every core itself), or on `filters` threads of
their own (the GPU: each image's copies to and from the device then overlap
another's). A semaphore of `depth` slots bounds the images in memory: a slot is taken
before an image is read and given back once its result is written (or it failed), so
memory stays flat however many files there are. A file that fails is reported through
`on_event` and the others go on; an exception that `compute` marks as fatal (`Fatal`)
stops the run after the writes under way. `Timings` sums the seconds each stage took.

The CLI (imgfilter.cli) draws the progress bar, prints the lines and picks the exit code.
"""

from __future__ import annotations

import contextlib
import glob
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UsageError

if TYPE_CHECKING:  # imported where a pool is made: one input needs none
    from concurrent.futures import ThreadPoolExecutor

# Extensions picked up inside directories (files named one by one are read whatever
# their extension: the reader goes by content).
IMAGE_EXTENSIONS = frozenset(
    (".png", ".jpg", ".jpeg", ".jpe", ".tif", ".tiff", ".bmp", ".dib", ".webp", ".gif")
    + (".pbm", ".pgm", ".ppm", ".pnm", ".npy")
)

TEMPLATE_FIELDS = ("stem", "ext", "name", "op")


def default_workers() -> int:
    """`--jobs` by default: the CPUs this process may run on. Decoding and encoding take
    most of a folder's time and scale with cores (a 16-CPU host decoded and encoded
    5-Mpixel JPEGs at 122 images/s on 8 threads, 227 on 16); threads waiting for the
    GPU or the disk are not among them (the filter threads are extra)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus)


def default_depth(workers: int) -> int:
    """Images in memory at once: enough to keep `workers` codec threads and the filter
    busy (some being decoded, one filtered, some being encoded)."""
    return 2 * workers + 1


# ------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Entry:
    """One input file. `base`: the directory argument it was found in (its output
    mirrors the path below it), else None. `found`: it came from a directory or a
    pattern, not named on the command line."""

    path: Path
    base: Path | None = None
    found: bool = False


def has_magic(arg: str) -> bool:
    return any(c in arg for c in "*?[")


def _walk(top: Path, recursive: bool) -> Iterable[Path]:
    """Image files in `top` (sorted; hidden files and directories left out)."""
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if recursive else []
        for name in sorted(files):
            if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS:
                yield Path(root) / name


def expand(
    args: Sequence[str | os.PathLike[str]], *, recursive: bool
) -> tuple[list[Entry], list[str]]:
    """The files the arguments name, each once (first mention wins), and a message
    for each argument that gives none (a directory without images, a pattern that
    matches nothing). A name that does not exist is kept: reading it reports it."""
    entries: list[Entry] = []
    problems: list[str] = []
    seen: set[str] = set()

    def add(entry: Entry) -> None:
        key = os.path.normcase(os.path.realpath(entry.path))
        if key not in seen:
            seen.add(key)
            entries.append(entry)

    for arg in args:
        text = os.fspath(arg)
        p = Path(text)
        if p.is_dir():
            found = [Entry(f, p, True) for f in _walk(p, recursive)]
            if not found:
                hint = "" if recursive else " (--recursive looks in its subdirectories)"
                problems.append(f"no images in directory {text}{hint}")
            for entry in found:
                add(entry)
        elif not os.path.lexists(p) and has_magic(text):
            matches = sorted(glob.glob(text, recursive=True))
            files = [Path(m) for m in matches if not Path(m).is_dir()]
            if not files:
                problems.append(f"no files match {text}")
            for f in files:
                add(Entry(f, None, True))
        else:
            add(Entry(p))
    return entries, problems


# ------------------------------------------------------------------------ outputs


def _default_ext(path: Path) -> str:
    from .io import SUPPORTED_WRITE_EXTENSIONS

    return path.suffix if path.suffix.lower() in SUPPORTED_WRITE_EXTENSIONS else ".png"


def default_template(op: str) -> str:
    """Today's rule, INPUT_STEM.OP.EXT (io.default_output), as a template."""
    return "{stem}." + op + "{ext}"


def render(template: str, path: Path, op: str) -> str:
    return template.format_map(
        {"stem": path.stem, "ext": _default_ext(path), "name": path.name, "op": op}
    )


def check_template(
    template: str,
    op: str,
    *,
    option: str = "--name",
    extensions: Sequence[str] | None = None,
    example: str | None = None,
) -> None:
    """UsageError (one line) unless `template` makes a file name ending in one of
    `extensions` (default: the image extensions imgfilter writes). `option` and
    `example` go into the message."""
    from .io import SUPPORTED_WRITE_EXTENSIONS

    allowed = tuple(extensions) if extensions is not None else SUPPORTED_WRITE_EXTENSIONS
    example = example or "{stem}." + op + "{ext}"
    fields = ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
    if (
        not template
        or "/" in template
        or (os.altsep and os.altsep in template)
        or (os.sep in template)
    ):
        raise UsageError(
            f"{option} {template!r}: give a file name template without '/', "
            f"e.g. '{example}' (fields {fields})"
        )
    try:
        name = render(template, Path("photo.png"), op)
    except KeyError as e:
        unknown = "{" + str(e.args[0]) + "}"
        raise UsageError(f"{option} {template!r}: unknown field {unknown}; use {fields}") from None
    except (ValueError, IndexError, AttributeError) as e:
        raise UsageError(
            f"{option} {template!r}: {e}; use fields {fields} (write {{{{ or }}}} for a brace)"
        ) from None
    if name in ("", ".", "..") or Path(name).suffix.lower() not in allowed:
        ends = "{ext} or one of " if extensions is None else ""
        raise UsageError(
            f"{option} {template!r} names photo.png's output {name!r}, without "
            f"{'an image extension' if extensions is None else 'the extension ' + allowed[0]}"
            f": end it with {ends}{', '.join(allowed)}"
        )


@dataclass(frozen=True)
class Job:
    source: Path
    target: Path
    # More outputs of the same input (classify's --proba and --overlay), in the order
    # of make_plan's `extras`.
    extras: tuple[Path, ...] = ()

    @property
    def targets(self) -> tuple[Path, ...]:
        return (self.target, *self.extras)


@dataclass(frozen=True)
class Extra:
    """A further output per input: named by `template` (`{op}` is `op`), written in the
    directory of the input's main output; `what` names it in messages."""

    what: str
    template: str
    op: str


@dataclass
class Plan:
    jobs: list[Job]
    # Files found in a directory or by a pattern that are another input's output (an
    # earlier run's result): left out, with the input they come from.
    left_out: list[tuple[Path, Path]] = field(default_factory=list)


def _key(p: Path) -> str:
    return os.path.normcase(os.path.realpath(p))


def target_for(entry: Entry, *, op: str, out_dir: Path | None, template: str) -> Path:
    name = render(template, entry.path, op)
    if out_dir is None:
        return entry.path.parent / name
    if entry.base is not None:
        rel = os.path.relpath(entry.path.parent, entry.base)
        return (out_dir / rel / name) if rel != os.curdir else out_dir / name
    return out_dir / name


def extra_for(entry: Entry, target: Path, extra: Extra) -> Path:
    """Where `extra` of the input `entry` goes: beside its main output `target`."""
    return target.parent / render(extra.template, entry.path, extra.op)


def make_plan(
    entries: Sequence[Entry],
    *,
    op: str,
    out_dir: Path | None,
    template: str,
    extras: Sequence[Extra] = (),
    what: str = "output",
) -> Plan:
    """Each input's output (and its `extras`); UsageError when two outputs would be one
    file (of two inputs, or two outputs of one input) or an output would replace an
    input (all found before any work starts). `what` names the main output."""
    targets = [target_for(e, op=op, out_dir=out_dir, template=template) for e in entries]
    outputs = [
        (t, *(extra_for(e, t, x) for x in extras)) for e, t in zip(entries, targets, strict=True)
    ]
    kinds = (what, *(x.what for x in extras))
    made_by: dict[str, int] = {}
    for i, outs in enumerate(outputs):
        for t in outs:
            made_by.setdefault(_key(t), i)
    keep: list[int] = []
    left_out: list[tuple[Path, Path]] = []
    for i, e in enumerate(entries):
        maker = made_by.get(_key(e.path))
        if e.found and maker is not None and maker != i:
            left_out.append((e.path, entries[maker].path))
        else:
            keep.append(i)
    by_target: dict[str, tuple[int, int]] = {}
    clashes: list[str] = []
    own = False  # the first clash is between two outputs of one input
    for i in keep:
        for k, t in enumerate(outputs[i]):
            first = by_target.setdefault(_key(t), (i, k))
            if first == (i, k):
                continue
            j, kj = first
            if j == i:
                own = own or not clashes
                clashes.append(
                    f"the {kinds[kj]} and the {kinds[k]} of {entries[i].path} would both be "
                    f"written to {t}"
                )
            else:
                clashes.append(
                    f"{entries[j].path} and {entries[i].path} would both be written to {t}"
                )
    if clashes:
        more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
        if not extras:
            fix = "give their directory instead of the files, or a --name that tells them apart"
        else:
            names = ", ".join(["--name", *(x.what for x in extras)])
            fix = (
                f"give them different names ({names})"
                if own
                else f"give their directory instead of the files, or names ({names}) that "
                "tell them apart"
            )
        raise UsageError(f"{clashes[0]}{more}: {fix}")
    sources = {_key(entries[i].path): i for i in keep}
    for i in keep:
        for k, t in enumerate(outputs[i]):
            j = sources.get(_key(t))
            if j is not None:
                whose = "itself" if j == i else f"the input {entries[j].path}"
                output = "output" if not extras else kinds[k]
                raise UsageError(
                    f"the {output} of {entries[i].path} would overwrite {whose}: choose "
                    "another --out-dir or --name"
                )
    return Plan([Job(entries[i].path, outputs[i][0], outputs[i][1:]) for i in keep], left_out)


# ----------------------------------------------------------------------- pipeline


class Skip(Exception):
    """Raised by `load`: the file is skipped (its output exists, --skip-existing)."""


class Fatal(Exception):
    """Raised by `compute` around an error that ends the run (the GPU failed): the
    writes under way finish, no new file is started."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


# The pipeline's stages, as `Timings` names them: `load`, `compute` on the codec thread
# or on a filter thread (the calling thread, filters=1, counts as one), `save`.
READ, FILTER_HERE, FILTER_THREAD, WRITE = "read", "filter here", "filter thread", "write"
SYNC = "fsync+rename"  # the rest of a write that `save` returned, on a sync thread


def sync_threads(workers: int) -> int:
    """Threads that finish the writes `save` leaves to them (io.stage_image's fsync and
    rename), so that a codec thread does not wait for the disk."""
    return max(2, workers // 4)


class Timings:
    """Seconds spent in each stage and how many images went through it, summed over
    images and threads (any thread may add): the pipeline's READ, FILTER_HERE or
    FILTER_THREAD, and WRITE."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
            self.counts[stage] = self.counts.get(stage, 0) + 1

    @contextlib.contextmanager
    def timed(self, stage: str):
        """Add the time the block takes to `stage` (whether or not it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - start)


@dataclass
class Stats:
    total: int = 0
    written: int = 0
    skipped: int = 0
    failed: int = 0
    bytes_in: int = 0  # sizes of the input files done (written, skipped or failed)
    in_memory: int = 0  # images read and not yet written or dropped
    peak_in_memory: int = 0
    fatal: BaseException | None = None
    workers: int = 0  # codec threads
    filters: int = 0  # threads that filter images not filtered on their codec thread
    timings: Timings = field(default_factory=Timings, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def done(self) -> int:
        return self.written + self.skipped + self.failed


# The last run's statistics (tests read the peak number of images in memory).
last_stats: Stats | None = None


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def run_pipeline(
    jobs: Sequence[Job],
    *,
    load: Callable[[Job], Any],
    compute: Callable[[Job, Any], Any],
    save: Callable[[Job, Any, Any], Any],
    workers: int,
    depth: int | None = None,
    on_event: Callable[[str, Job, BaseException | None, Stats], None] | None = None,
    filters: int = 1,
    here: Callable[[Job, Any], bool] | None = None,
) -> Stats:
    """Load, compute and save each job; return the counts.

    `load(job)` and `save(job, loaded, result)` run on `workers` threads. `compute(job,
    loaded)` runs on the thread that loaded the image, between its load and its save,
    where `here(job, loaded)` is true; else in the calling thread (filters=1) or on
    `filters` threads of their own. `on_event(kind, job, error, stats)` is called once
    per job ("written", "skipped" or "failed"), from any thread, with the counts
    already updated (and under their lock, so calls never overlap). A `Fatal` from
    compute stops the run: images decoded but not yet filtered are dropped uncounted,
    writes under way finish. The stages' seconds go to stats.timings.
    """
    global last_stats
    depth = depth or default_depth(workers)
    stats = Stats(total=len(jobs), workers=max(1, workers), filters=max(1, filters))
    last_stats = stats
    clock = stats.timings
    slots = threading.Semaphore(depth)
    # (job, loaded, error, kind): kind "loaded" (to be filtered here), "skipped",
    # "failed" (error) or "done" (filtered and saved on its codec thread)
    ready: queue.SimpleQueue[tuple[Job, Any, BaseException | None, str]] = queue.SimpleQueue()
    stop = threading.Event()

    def finish(kind: str, job: Job, error: BaseException | None) -> None:
        with stats.lock:
            setattr(stats, kind, getattr(stats, kind) + 1)
            stats.bytes_in += _size(job.source)
            stats.in_memory -= 1
            if on_event is not None:
                on_event(kind, job, error, stats)
        slots.release()

    def decode(job: Job) -> None:
        try:
            with clock.timed(READ):
                loaded = load(job)
        except Skip:
            ready.put((job, None, None, "skipped"))
        except BaseException as e:  # noqa: BLE001 - reported, the others go on
            ready.put((job, None, e, "failed"))
        else:
            try:
                on_this_thread = here is not None and here(job, loaded)
            except BaseException as e:  # noqa: BLE001
                ready.put((job, None, e, "failed"))
                return
            if on_this_thread:
                filter_one(job, loaded, FILTER_HERE, encode)
                ready.put((job, None, None, "done"))
            else:
                ready.put((job, loaded, None, "loaded"))

    def encode(job: Job, loaded: Any, result: Any) -> None:
        try:
            with clock.timed(WRITE):
                rest = save(job, loaded, result)
        except BaseException as e:  # noqa: BLE001
            finish("failed", job, e)
            return
        if rest is None:
            finish("written", job, None)
        else:  # the fsync and the rename, off the codec thread
            syncer.submit(commit, job, rest)

    def commit(job: Job, rest: Callable[[], Any]) -> None:
        try:
            with clock.timed(SYNC):
                rest()
        except BaseException as e:  # noqa: BLE001
            finish("failed", job, e)
        else:
            finish("written", job, None)

    def feed(pool: ThreadPoolExecutor) -> None:
        for job in jobs:
            while not slots.acquire(timeout=0.1):
                if stop.is_set():
                    return
            if stop.is_set():
                slots.release()
                return
            with stats.lock:
                stats.in_memory += 1
                stats.peak_in_memory = max(stats.peak_in_memory, stats.in_memory)
            pool.submit(decode, job)

    def filter_one(job: Job, loaded: Any, stage: str, then: Callable[[Job, Any, Any], Any]) -> bool:
        """compute, then `then(job, loaded, result)` (the save, or queueing it); False
        once the run must stop."""
        if stop.is_set():
            return False
        try:
            with clock.timed(stage):
                result = compute(job, loaded)
        except Fatal as e:
            with stats.lock:
                first = stats.fatal is None
                stats.fatal = stats.fatal if not first else e.error
            stop.set()
            if first:
                finish("failed", job, e.error)
            return False
        except BaseException as e:  # noqa: BLE001
            finish("failed", job, e)
            return True
        then(job, loaded, result)
        return True

    from concurrent.futures import ThreadPoolExecutor

    syncs = ThreadPoolExecutor(sync_threads(workers), thread_name_prefix="imgfilter-sync")
    codecs = ThreadPoolExecutor(max(1, workers), thread_name_prefix="imgfilter-io")
    with syncs as syncer, codecs as pool:

        def queue_save(job: Job, loaded: Any, result: Any) -> None:
            pool.submit(encode, job, loaded, result)

        feeder = threading.Thread(target=feed, args=(pool,), name="imgfilter-feed", daemon=True)
        feeder.start()
        with _filter_pool(filters) as filter_pool:
            try:
                for _ in range(len(jobs)):
                    item = _next(ready, stop)
                    if item is None:  # a filter thread stopped the run
                        break
                    job, loaded, error, kind = item
                    if kind == "skipped":
                        finish("skipped", job, None)
                    elif kind == "failed":
                        finish("failed", job, error)
                    elif kind == "done":
                        continue
                    elif filter_pool is not None:
                        if stop.is_set():
                            break
                        filter_pool.submit(filter_one, job, loaded, FILTER_THREAD, queue_save)
                    elif not filter_one(job, loaded, FILTER_THREAD, queue_save):
                        break
            except BaseException:  # Ctrl-C: queued filter tasks return at once
                stop.set()
                raise
        feeder.join()
    return stats


def _next(ready: queue.SimpleQueue, stop: threading.Event):
    """The next decoded image, or None once `stop` is set (by a filter thread: the
    images it would wait for are no longer read)."""
    while True:
        try:
            return ready.get(timeout=0.05)
        except queue.Empty:
            if stop.is_set():
                return None


@contextlib.contextmanager
def _filter_pool(filters: int):
    """A pool of `filters` threads for compute (waited for on exit), or None for 1."""
    from concurrent.futures import ThreadPoolExecutor

    if filters <= 1:
        yield None
        return
    with ThreadPoolExecutor(filters, thread_name_prefix="imgfilter-filter") as pool:
        yield pool
