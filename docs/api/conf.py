"""Sphinx configuration for imgfilter's API reference (docs/api).

Build: sphinx-build -W -n -b html docs/api build/api-docs (docs/api/README.md).
The pages are generated from the docstrings (autodoc, Google style through napoleon),
so the modules are imported: the CUDA parts run on Numba's simulator, which needs
neither a GPU nor a CUDA compiler.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Document the working tree, not an installed copy of the package.
sys.path.insert(0, str(ROOT))
# Before anything imports Numba: on the simulator, importing kernels/ (numba.cuda)
# needs no GPU, driver or CUDA toolkit.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

project = "imgfilter"
author = "imgfilter developers"
copyright = "imgfilter developers"
release = "0.1.0"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]

# Single backquotes are code, as in the docstrings (and Markdown); cross-references
# use explicit roles (:func:, :class:).
default_role = "code"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Defaults as written in the source (np.float32, not "<class 'numpy.float32'>").
autodoc_preserve_defaults = True
autodoc_default_options = {"show-inheritance": False}

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Annotations naming classes of other projects (NumPy, Dask, the standard library's
# typing names) have no target here: the reference is built offline, without
# intersphinx inventories.
html_theme = "alabaster"
html_title = "imgfilter API reference"
exclude_patterns = ["README.md"]

nitpick_ignore_regex = [
    ("py:class", r"(np|numpy|da|dask|os|pathlib|typing|collections\.abc|types)\..*"),
    ("py:class", r"Any|Path|Callable|ModuleType|module|imgfilter\.io\w*\.ImageMetadata"),
]


def _dataclass_signature(app, what, name, obj, options, signature, return_annotation):
    """A dataclass's generated __init__ keeps the annotations of a module with
    `from __future__ import annotations` as strings, which autodoc shows quoted
    ('dict[str, float]'), and shows a default_factory as `<factory>`, which is not
    Python: the signature then cannot be parsed. Show the annotations as written in
    the class and each factory as its call (`dict()`)."""
    if signature and dataclasses.is_dataclass(obj):
        signature = re.sub(r": '([^']*)'", r": \1", signature)
        for f in dataclasses.fields(obj):
            if f.default_factory is not dataclasses.MISSING:
                call = f"{getattr(f.default_factory, '__name__', 'factory')}()"
                signature = signature.replace("<factory>", call, 1)
    return signature, return_annotation


def setup(app):
    app.connect("autodoc-process-signature", _dataclass_signature)
