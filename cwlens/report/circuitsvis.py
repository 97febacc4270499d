"""A CircuitsVis view that works offline: the widget's JavaScript is inlined.

``circuitsvis`` renders its widgets in two ways: ``str(view)`` (what a user saves to a
file) and ``_repr_html_`` when it can reach the internet load the bundle from a CDN, so a
saved view, or a notebook on a machine without internet, shows a blank cell. Its wheel
ships the bundle itself (``circuitsvis/dist/cdn/iife.js``, about 1.3 MB): a
:class:`CircuitsVisView` always inlines it, in a notebook, in ``str(view)`` and in the
page :meth:`CircuitsVisView.save` writes, which opens from disk with no network.
"""

import html
from pathlib import Path

from cwlens.errors import CwlensError, InvalidArgumentError


class CircuitsVisView:
    """One rendered CircuitsVis widget, its JavaScript inlined (no CDN, no network).

    Shows itself in a notebook (``_repr_html_``); ``str(view)`` is the same HTML fragment
    (a ``<div>`` and the ``<script>`` that draws into it); :meth:`save` writes a whole page
    that opens from disk in any browser; :meth:`to_html` returns that page."""

    def __init__(self, fragment: str, title: str = "CircuitsVis view"):
        self.fragment = fragment
        self.title = title

    def _repr_html_(self) -> str:
        return self.fragment

    def __html__(self) -> str:
        return self.fragment

    def __str__(self) -> str:
        return self.fragment

    def __repr__(self) -> str:
        return (f"CircuitsVisView({self.title!r}, {len(self.fragment) / 1e6:.1f} MB of HTML, "
                "JavaScript inlined: .save(path) writes a page that opens offline)")

    def to_html(self) -> str:
        """A whole HTML page holding the widget (UTF-8, no external resource)."""
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f"<title>{html.escape(self.title)}</title></head>\n<body>\n"
                f"<h3 style=\"font-family:sans-serif\">{html.escape(self.title)}</h3>\n"
                f"{self.fragment}\n</body></html>\n")

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_html` to ``path`` (a ``.html`` file; parent folders are made);
        returns the path. Open it with a browser, e.g. ``file:///.../view.html``."""
        path = Path(path)
        if path.is_dir():
            raise InvalidArgumentError(f"path={str(path)!r} is a folder; pass the path of the "
                                       f".html file to write, e.g. {str(path / 'view.html')!r}.")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_html(), encoding="utf-8")
        return path


def offline_view(rendered, title: str) -> CircuitsVisView:
    """The inlined form of a ``circuitsvis`` ``RenderedHTML`` (its ``local_src``)."""
    fragment = getattr(rendered, "local_src", None)
    if not isinstance(fragment, str) or "CircuitsVis" not in fragment:
        raise CwlensError(
            f"this circuitsvis ({type(rendered).__name__}) did not return an inlined rendering "
            "(RenderedHTML.local_src): install circuitsvis>=1.43 (pip install cwlens[viz]).")
    return CircuitsVisView(fragment, title)
