"""Where compiled kernels are kept between processes (Numba-free, so any path may ask)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The kernel cache: $IMGFILTER_CACHE_DIR, else $XDG_CACHE_HOME/imgfilter/kernels,
    else ~/.cache/imgfilter/kernels. Generated kernel sources (and Numba's compiled
    cache of them) and exported cubins live here."""
    env = os.environ.get("IMGFILTER_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "imgfilter" / "kernels"
