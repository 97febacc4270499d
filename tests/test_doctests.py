"""The API reference (docs/api.md, rendered from the docstrings by mkdocstrings) is real:
every public call has Args, Returns and Examples sections, the reference lists it, and
its examples run as doctests on a tiny seeded model."""

import doctest
import inspect
import re
from pathlib import Path

import pytest

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _public():
    """Every public call: the names of ``cwlens.__all__`` and ``cwlens.engine.batching.pad_batch``."""
    import cwlens.engine.batching

    names = {n: getattr(cwlens, n) for n in cwlens.__all__ if n not in ("__version__", "reducers")}
    names["pad_batch"] = cwlens.engine.batching.pad_batch
    return names


PUBLIC = _public()


def _sections(obj) -> set[str]:
    return set(re.findall(r"^\s*(Args|Returns|Raises|Examples|Attributes):\s*$",
                          inspect.getdoc(obj) or "", re.M))


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_call_has_its_sections(name):
    obj = PUBLIC[name]
    need = {"Examples"} if inspect.isclass(obj) else {"Args", "Returns", "Examples"}
    missing = need - _sections(obj)
    assert not missing, f"cwlens.{name}'s docstring lacks {sorted(missing)} (Google style)"


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_api_page_documents_it(name):
    listed = re.findall(r"^::: ([\w.]+)$", API_PAGE.read_text(encoding="utf-8"), re.M)
    assert any(entry.rsplit(".", 1)[-1] == name for entry in listed), (
        f"docs/api.md has no '::: <module>.{name}' entry")


def _examples():
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = []
    for name, obj in sorted(PUBLIC.items()):
        for t in finder.find(obj, f"cwlens.{name}", globs={}):
            if t.examples:
                tests.append(t)
    return tests


EXAMPLES = _examples()


def test_the_examples_are_collected():
    """Each public call has at least one runnable example (a class's may sit on a method)."""
    owners = {t.name.split(".")[1] for t in EXAMPLES}
    assert owners == set(PUBLIC), sorted(set(PUBLIC) - owners)


@pytest.mark.parametrize("test", EXAMPLES, ids=[t.name for t in EXAMPLES])
def test_example_runs(test):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out: list[str] = []
    result = runner.run(test, out=out.append)
    assert result.failed == 0, "".join(out)
