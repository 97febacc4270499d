"""Save plotly figures as self-contained HTML (no CDN) and PNG.

PNG export uses kaleido >= 1 with a Chromium: ``$BROWSER_PATH``, one on ``PATH`` (Debian:
``apt-get install chromium``; ``scripts/setup.sh --browser``, as ``make test`` runs it), or
kaleido's own Chrome (``plotly_get_chrome``, no root), found where kaleido looks for it.
Without a browser the HTML is still written and a one-line note says how to get PNGs.
"""

import os
import shutil
import warnings
from pathlib import Path
from unittest import mock

from cwlens.errors import CwlensWarning

_CHROME_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chrome() -> str | None:
    """``$BROWSER_PATH`` or the first Chrome-like browser on PATH."""
    env = os.environ.get("BROWSER_PATH")
    if env and os.access(env, os.X_OK):
        return env
    for name in _CHROME_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return _kaleido_chrome()


def _kaleido_chrome() -> str | None:
    """The Chrome kaleido downloaded itself (``plotly_get_chrome``), where kaleido's browser
    layer (choreographer) looks for it; None without one."""
    try:
        from choreographer.browsers.chromium import Chromium  # optional: choreographer (kaleido's)

        found = Chromium.find_browser(skip_local=False, skip_typical=True)
    except Exception:  # an older or newer choreographer: no path of its own to offer
        return None
    return found if found and os.access(found, os.X_OK) else None


def save_figure(fig, path_stem: str | Path, png: bool = True, scale: float = 1.0) -> list[Path]:
    """Write ``<stem>.html`` (plotly.js inlined: opens offline) and ``<stem>.png``. A dot in
    the stem stays (``edges_captured_qwen2.5-coder-0.5b`` is not cut at ``.5``); a stem ending
    in ``.html`` or ``.png`` loses that ending.

    Returns the paths written.
    """
    stem = Path(path_stem)
    if stem.suffix in (".html", ".png"):
        stem = stem.with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    html, out = stem.parent / f"{stem.name}.html", stem.parent / f"{stem.name}.png"
    fig.write_html(html, include_plotlyjs=True, full_html=True)
    written = [html]
    if png:
        chrome = find_chrome()
        if chrome is None:
            warnings.warn(  # one "cwlens: note:" line in the CLI
                f"no Chromium, so {out} was skipped (the HTML is written): "
                "`plotly_get_chrome` fetches kaleido's own Chrome (no root), or install one "
                "(scripts/setup.sh --browser) or set BROWSER_PATH.",
                CwlensWarning, stacklevel=2,
            )
            return written
        # $BROWSER_PATH (where kaleido looks for Chromium) for this export only: a process
        # setting left behind would outlive the browser it names
        with mock.patch.dict(os.environ, {} if "BROWSER_PATH" in os.environ else {"BROWSER_PATH": chrome}):
            if _write_png(fig, out, scale):
                written.append(out)
    return written


PNG_TRIES = 3


def _write_png(fig, out: Path, scale: float) -> bool:
    """``fig.write_image`` with retries: on a loaded machine kaleido's Chromium page can
    run the export before its own scripts are in (``ReferenceError: kaleido_scopes is not
    defined``). After :data:`PNG_TRIES` failures a warning names the error and the PNG is
    skipped (the HTML is written): a figure must not end a run that computed for hours."""
    error: Exception | None = None
    for _ in range(PNG_TRIES):
        try:
            fig.write_image(out, format="png", scale=scale)
            return True
        except Exception as e:  # kaleido raises its own JavascriptError / ChromeNotFound types
            error = e
    warnings.warn(f"{out} was not written: kaleido failed {PNG_TRIES} times "
                  f"({type(error).__name__}: {str(error)[:200]}). The HTML beside it was "
                  "written; rerun the command (with --table-only / --report-only where it has "
                  "one) to retry the PNG.", stacklevel=3)
    return False
