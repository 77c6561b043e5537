"""Sphinx configuration: the spec/ pages, built with MyST (warnings are errors in CI)."""

project = "pgspec"
author = "pgspec developers"
extensions = ["myst_parser"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "alabaster"
suppress_warnings = []
