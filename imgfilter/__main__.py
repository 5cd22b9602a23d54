"""The `imgfilter` command (console script and `python -m imgfilter`).

A GPU command line starts opening the CUDA context in the background before the CLI
and NumPy are imported (`imgfilter.backends.warmup`); then `imgfilter.cli` runs.
"""

import os
import sys

from .backends import warmup


def main() -> None:
    # A command ends right after its output: a kernel compiled for the next runs goes
    # to a detached process (imgfilter.backends.cuda.BACKGROUND), not a thread.
    os.environ.setdefault("IMGFILTER_BACKGROUND_COMPILE", "process")
    warmup.start(sys.argv[1:])
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
