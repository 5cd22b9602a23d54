"""`python -m imgfilter ...` runs the command-line interface (imgfilter.cli)."""

from .cli import main

if __name__ == "__main__":
    main()
