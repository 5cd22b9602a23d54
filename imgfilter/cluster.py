"""Many files on a Dask cluster: each file read, filtered and written by one task on a
worker (`--gpus N`: a local dask-cuda cluster, one worker per GPU; `--scheduler
ADDRESS`: an existing cluster, whose workers must see the inputs and outputs at the
same paths). Dask schedules; this module only submits the files and collects how each
ended, with the same counts and events as `imgfilter.files.run_pipeline`.

Needs `distributed` (and `dask-cuda` for `--gpus`): `pip install "imgfilter[dask-cuda]"`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .errors import UsageError
from .files import Fatal, Job, Skip, Stats, _size


def worker_threads(gpus: int, jobs: int | None) -> int:
    """Task threads of each local GPU worker: `jobs` (--jobs), else 8, at most the CPU
    count shared out among the workers. A task decodes, filters and encodes one file;
    the codecs release the GIL, so a worker's threads overlap them as a local run's
    codec threads do."""
    share = max(1, (os.cpu_count() or 1) // max(gpus, 1))
    return max(1, min(jobs or 8, share))


@contextlib.contextmanager
def connect(gpus: int | None, scheduler: str | None, jobs: int | None = None) -> Iterator[Any]:
    """A `distributed.Client` for the `with` block: on a new local cluster of `gpus`
    GPU workers of `worker_threads(gpus, jobs)` threads each (closed after it), or on
    the scheduler at `scheduler` (its workers keep their own threads). UsageError (one
    line) for a missing package, both options at once, or a scheduler that does not
    answer."""
    if gpus is not None and scheduler is not None:
        raise UsageError("give --gpus or --scheduler, not both")
    try:
        from distributed import Client
    except ImportError:
        raise UsageError(
            'a Dask cluster needs distributed: pip install "imgfilter[dask-cuda]"'
        ) from None
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError) as exc:
            message = f"--scheduler {scheduler}: no Dask scheduler answers ({exc})"
            raise UsageError(message) from None
        with client:
            yield client
        return
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        raise UsageError('--gpus needs dask-cuda: pip install "imgfilter[dask-cuda]"') from None
    import dask

    threads = worker_threads(gpus, jobs)
    with (
        dask.config.set(_without_malloc_trim(dask.config)),
        LocalCUDACluster(n_workers=gpus, threads_per_worker=threads) as cluster,
        Client(cluster) as client,
    ):
        yield client


def _without_malloc_trim(config: Any) -> dict:
    """Dask's settings for the variables its nanny sets before starting a worker, less
    MALLOC_TRIM_THRESHOLD_ (for `config.set`).

    The nanny sets it to 65536 so that glibc hands freed memory back to the OS at once.
    Setting it also stops glibc from raising its mmap threshold, so every image-sized
    array (decoded, copied back, encoded) becomes a fresh mapping whose pages fault in
    on first touch. (Left out of the dict rather than set to None, which distributed
    releases before 2024 would pass on as the string "None".)"""
    environ = dict(config.get(_PRE_SPAWN, {}))
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    return {_PRE_SPAWN: environ}


_PRE_SPAWN = "distributed.nanny.pre-spawn-environ"


def _one(job: Job, load: Callable, compute: Callable, save: Callable) -> tuple[str, Any]:
    """On a worker: the whole job; ("written" | "skipped", None), ("failed", error), or
    ("fatal", error) when compute raised `Fatal` (the GPU failed: the run stops)."""
    try:
        loaded = load(job)
    except Skip:
        return "skipped", None
    except Exception as exc:  # noqa: BLE001 - reported, the others go on
        return "failed", exc
    try:
        save(job, loaded, compute(job, loaded))
    except Fatal as exc:
        return "fatal", exc.error
    except Exception as exc:  # noqa: BLE001
        return "failed", exc
    return "written", None


def run_on_cluster(
    client: Any,
    jobs: Sequence[Job],
    *,
    load: Callable[[Job], Any],
    compute: Callable[[Job, Any], Any],
    save: Callable[[Job, Any, Any], Any],
    on_event: Callable[[str, Job, BaseException | None, Stats], None] | None = None,
) -> Stats:
    """Run each job as one task on `client`'s cluster; return the counts. `on_event` as
    in `files.run_pipeline`, called here as each task ends (in completion order). When
    the GPU fails in a task (compute raised `files.Fatal`) that file fails, the run
    stops as a local one does: `stats.fatal` is set and the tasks not yet ended are
    cancelled (their files left uncounted: not started)."""
    from distributed import as_completed

    stats = Stats(total=len(jobs))
    # One task function for all files: Dask serializes a function once and caches it,
    # so each task carries only its Job (the closures can hold much more).
    task = functools.partial(_one, load=load, compute=compute, save=save)
    futures = {client.submit(task, job, pure=False): job for job in jobs}
    for future in as_completed(futures):
        job = futures[future]
        try:
            kind, error = future.result()
        except Exception as exc:  # noqa: BLE001 - a worker lost, a task that cannot run
            kind, error = "failed", exc
        fatal = kind == "fatal"
        kind = "failed" if fatal else kind
        with stats.lock:
            setattr(stats, kind, getattr(stats, kind) + 1)
            stats.bytes_in += _size(job.source)
            if on_event is not None:
                on_event(kind, job, error, stats)
        if fatal:
            stats.fatal = error
            client.cancel([f for f in futures if not f.done()])
            break
    return stats
