"""Sphinx configuration of the streams-sched docs site (build it with scripts/docs.sh).

Pages are Markdown (MyST), so the text reads the same on GitHub; the theme is furo.
The settings reference (reference/settings.md) is generated from the code's settings
table by the local extension _ext/settings_ref.py, loaded only when it is there; the
diagrams are drawn from diagrams/*.dot by sphinx.ext.graphviz.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath("_ext"))

project = "streams-sched"
author = "the streams-sched authors"
copyright = "the streams-sched authors"

extensions = ["myst_parser", "sphinx.ext.graphviz"] + (
    ["settings_ref"] if os.path.exists(os.path.join(os.path.dirname(__file__), "_ext", "settings_ref.py")) else []
)

# Diagrams are Graphviz sources in diagrams/*.dot, drawn by Debian's `dot` at build time
# (scripts/bootstrap.sh installs the graphviz package with the docs extra), as SVG so
# that their text stays text.
graphviz_output_format = "svg"

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Anchors for headings down to ###, so pages can link to a section as page.md#anchor
# (the same slugs GitHub makes).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

html_theme = "furo"
html_title = "streams-sched"
html_static_path: list[str] = []

# Code blocks are checked by tests/test_docs.py; Pygments must not fail on shell
# prompts or on text blocks.
highlight_language = "text"

# The settings reference (reference/*) is written by another part of the build and may
# be absent: a toctree glob that matches nothing must not fail the -W build.
suppress_warnings = ["toc.empty_glob"]
