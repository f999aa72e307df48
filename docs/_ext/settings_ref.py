"""Sphinx extension: the ``streams-settings`` directive, the settings reference generated
from the table :data:`streams_sched.config.SETTINGS`.

In a MyST page::

    ```{streams-settings}
    ```

renders :func:`streams_sched.config.settings_markdown`: per section a heading one level
below the page's title and a table (setting, default, meaning). The Markdown is parsed by
the page's own parser, so the directive belongs in a MyST (Markdown) page.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

__all__ = ["SettingsDirective", "setup"]


class SettingsDirective(SphinxDirective):
    """``streams-settings``: the settings reference, grouped by section."""

    has_content = False
    option_spec = {"level": int}

    def run(self) -> list[nodes.Node]:
        from streams_sched import config, settings_parse
        from streams_sched.config import settings_markdown

        for module in (config, settings_parse):  # the page is read again when the table changes
            self.env.note_dependency(module.__file__ or "")
        if not hasattr(self.state, "_renderer"):
            raise self.error("streams-settings renders Markdown: use it in a MyST page (myst_parser)")
        text = settings_markdown(self.options.get("level", 2))
        container = nodes.section()  # a holder: its children replace the directive
        container.document = self.state.document
        self.state.nested_parse(StringList(text.splitlines(), source="streams_sched.config.SETTINGS"),
                                self.content_offset, container, match_titles=True)
        return list(container.children)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("streams-settings", SettingsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
