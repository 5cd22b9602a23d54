"""`python -m imgfilter.cli`: the same as `python -m imgfilter`."""

from . import main

main()
