"""Offline MathJax: serve MathJax 3 from the build's own ``_static`` folder, never from a CDN.

The copy comes from the ``django-static-mathjax`` wheel (MathJax 3.2.2 as plain static files,
no dependencies; a dev dependency of pgspec).  We copy the single combined component
``tex-chtml-full.js`` (every TeX extension built in, so nothing is fetched on demand), the CHTML
web fonts it loads, and the lazily loaded accessibility/menu components, and point Sphinx's
``mathjax_path`` at the copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sphinx.errors import ExtensionError

COMPONENT = "tex-chtml-full.js"
# Folders (under MathJax's es5/) that the combined component may load at run time.
RUNTIME_DIRS = ("output/chtml/fonts/woff-v2", "a11y", "ui", "sre")


def mathjax_root() -> Path:
    try:
        import mathjax  # the django-static-mathjax wheel
    except ImportError:
        raise ExtensionError(
            "offline MathJax needs the django-static-mathjax package (a pgspec dev dependency): "
            "pip install -c constraints.txt -e '.[dev]'") from None
    root = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (root / COMPONENT).is_file():
        raise ExtensionError(f"offline MathJax: {root / COMPONENT} is missing from the django-static-mathjax install")
    return root


def _config_inited(app, config):
    mathjax_root()  # fail early, with the install command, when the package is missing
    config.mathjax_path = f"mathjax/{COMPONENT}"


def _copy(app, exc):
    if exc is not None or app.builder.format != "html":
        return
    root = mathjax_root()
    dest = Path(app.outdir) / "_static" / "mathjax"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / COMPONENT, dest / COMPONENT)
    for sub in RUNTIME_DIRS:
        if (root / sub).is_dir():
            shutil.copytree(root / sub, dest / sub, dirs_exist_ok=True)


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
