"""The `imgfilter` command (console script and `python -m imgfilter`).

A GPU command line starts opening the CUDA context in the background before the CLI
and NumPy are imported (`imgfilter.backends.warmup`); then `imgfilter.cli` runs.
"""

import sys

from .backends import warmup


def main() -> None:
    warmup.start(sys.argv[1:])
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
