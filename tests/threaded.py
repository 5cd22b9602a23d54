"""Running test work in many threads at once (issue 28's thread-safety tests)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_in_threads(count: int, work: Callable[[int], object]) -> list[str]:
    """Run work(0) ... work(count - 1), each in its own thread, all released together
    by a barrier (first uses collide); return the errors, one line per failed thread."""
    errors: list[str] = []
    barrier = threading.Barrier(count)

    def body(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(f"thread {i}: {exc!r}")

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
