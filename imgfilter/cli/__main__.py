"""`python -m imgfilter.cli`: the same as `python -m imgfilter`."""

from ..__main__ import main

main()
