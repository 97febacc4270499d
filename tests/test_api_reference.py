"""The API reference reads: docs/api.md opens with a table of every call (generated from
the docstrings, kept in sync here), readable where the ``:::`` directives below it are
not (GitHub, an editor); and the docstrings render in the site as written.

mkdocstrings parses Google-style docstrings with griffe: a Returns line that starts
``A :class:`X` ...`` reads as a value *named* "A" described as "class:`X`...", so the site
showed "A" and a raw role. Every object the page lists is parsed here with the site's
options and no Returns item may carry a name.
"""

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "api.md"


def _listed() -> list[str]:
    return re.findall(r"^::: ([\w.]+)$", API_PAGE.read_text(encoding="utf-8"), re.M)


def _resolve(path: str):
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except AttributeError:  # a module of its own
        return importlib.import_module(path)


@pytest.mark.parametrize("path", _listed())
def test_returns_section_renders_as_text(path):
    from griffe import Docstring

    doc = Docstring(inspect.getdoc(_resolve(path)) or "", parser="google",
                    parser_options={"returns_multiple_items": False})
    for section in doc.parse():
        if section.kind.value == "returns":
            for item in section.value:
                assert not item.name, (
                    f"{path}: its Returns section renders as a value named {item.name!r} "
                    f"({str(item.description)[:50]!r}): start the line without 'word :', e.g. "
                    "'The ``X`` ...'")


def test_api_table_is_current():
    """The table at the top of docs/api.md is what scripts/api_table.py makes now."""
    import runpy

    table = runpy.run_path(str(ROOT / "scripts" / "api_table.py"))["table"]()
    text = API_PAGE.read_text(encoding="utf-8")
    start, end = "<!-- api-table:start -->", "<!-- api-table:end -->"
    assert start in text and end in text, "docs/api.md has no api-table block"
    held = text[text.index(start) + len(start):text.index(end)].strip()
    assert held == table.strip(), "run `python scripts/api_table.py --write` (docs/api.md)"


def test_api_table_lists_every_entry():
    import runpy

    table = runpy.run_path(str(ROOT / "scripts" / "api_table.py"))["table"]()
    for path in _listed():
        assert re.search(rf"[`.]{path.rsplit('.', 1)[-1]}\b", table), path
