"""The table at the top of docs/api.md: every call the page documents, its parameters and
the first sentence of its docstring, grouped as the page is. The ``:::`` directives below
it render only in the built site; the table reads anywhere (GitHub, an editor).

    python scripts/api_table.py           # print the table
    python scripts/api_table.py --write   # put it into docs/api.md, between its markers

``tests/test_api_reference.py`` checks that the page holds the table this makes.
"""

import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"
START, END = "<!-- api-table:start -->", "<!-- api-table:end -->"


def _entries() -> list[tuple[str, str]]:
    """``(section heading, dotted path)`` of each ``:::`` directive, in page order."""
    section, out = "", []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("::: "):
            out.append((section, line[4:].strip()))
    return out


def _first_sentence(doc: str) -> str:
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r":(?:class|func|mod|data|meth|attr):`~?([^`]+)`", r"`\1`", text)
    text = re.sub(r"`[\w.]+\.(\w+)`", r"`\1`", text)  # cwlens.engine.x.name -> name
    match = re.match(r"(.+?[.:])(?:\s|$)", text)
    sentence = match.group(1) if match else text
    return sentence.rstrip(":") + ("." if sentence.endswith(":") else "")


def _call(name: str, obj) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"`{name}`"
    params = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.VAR_POSITIONAL:
            params.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            params.append(f"**{p.name}")
        else:
            params.append(p.name)
    return f"`{name}({', '.join(params)})`"


def resolve(path: str):
    """The object a ``:::`` directive names: a module, or a name in one."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except AttributeError:
        return importlib.import_module(path)


def table() -> str:
    rows, section = ["| call | what it does |", "|---|---|"], None
    for heading, path in _entries():
        obj, name = resolve(path), path.rpartition(".")[2]
        if heading != section:
            rows.append(f"| **{heading}** | |")
            section = heading
        what = _first_sentence(inspect.getdoc(obj) or "").replace("|", "\\|")
        if inspect.ismodule(obj):
            call = f"`{path}` (module)"
        elif inspect.isclass(obj):
            call = f"`{name}` (class)"
        else:
            call = _call(name, obj)
        rows.append(f"| {call} | {what} |")
    return "\n".join(rows) + "\n"


def write() -> None:
    text = PAGE.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{PAGE} has no {START} ... {END} block")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{START}\n{table()}{END}{tail}", encoding="utf-8")
    print(f"wrote the table into {PAGE}")


if __name__ == "__main__":
    write() if "--write" in sys.argv[1:] else print(table(), end="")
