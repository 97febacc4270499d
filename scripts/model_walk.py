"""Follow the model through cwlens: the house counts of docs/architecture.md (issue 49).

    python scripts/model_walk.py                 # every count, a small model on this CPU
    python scripts/model_walk.py --docs docs/architecture.md   # and write its table

Three counts are read from the source: the calls of ``wrap(`` in ``cwlens/`` (the handle
fetched again), the imports inside functions (of cwlens' own modules and of others), and
the lines of ``cwlens/``. Two walks are traced (``sys.setprofile``) on real runs:

- ``run_faithfulness`` on the tiny Llama of :mod:`cwlens.testing` (two texts, every metric);
- ``score_program`` on tracr's compiled ``frac_prevs`` (when tracr is installed).

A *stay* is a cwlens function (outside ``engine/handle.py``) called with the model or its
handle among its arguments (the model's own methods aside); a *room* is the module it is
in. A *climb* is a stay called, from the nearest stay below it on the stack, in a higher
layer of the import-linter layers contract (e.g. an engine function calling back into a
study): the model went back up. A *visit to handle.py* is a distinct (caller, handle.py
function) pair. *Layers resolved* counts the calls of ``resolve_layers`` (each resolution
of a layer argument).
"""

import argparse
import ast
import os
import re
import sys
from collections import Counter
from pathlib import Path

import cwlens

PACKAGE = Path(cwlens.__file__).resolve().parent  # the cwlens that is imported (a checkout's)
#: The layers contract of pyproject.toml, top (presentation) first.
LAYERS = [("__main__", "cli", "groundtruth", "replication", "report", "plotting", "testing"),
          ("faithfulness", "sinks", "circuits", "graphs", "lmeval"),
          ("runs",), ("engine",), ("core", "datasets"), ("errors",)]
START, END = "<!-- house-counts:start -->", "<!-- house-counts:end -->"


def layer_rank(module: str) -> int:
    """0 for the bottom layer (errors) up to 5 (presentation); the package's own
    ``__init__`` counts as presentation."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__main__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return len(LAYERS) - 1 - i
    return len(LAYERS) - 1


def source_counts() -> dict:
    """``wrap(`` calls, imports inside functions (own / other), lines of cwlens/."""
    wraps = inner_own = inner_other = lines = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines += text.count("\n")
        wraps += len(re.findall(r"(?<![\w.])wrap\(", text)) - len(re.findall(r"def wrap\(", text))
        for inner in _inner_imports(ast.parse(text), False):
            if isinstance(inner, ast.Import):
                for alias in inner.names:
                    own = alias.name.startswith("cwlens")
                    inner_own, inner_other = inner_own + own, inner_other + (not own)
            else:
                own = (inner.module or "").startswith("cwlens") or inner.level > 0
                inner_own, inner_other = inner_own + own, inner_other + (not own)
    return {"wrap_calls": wraps, "inner_imports_own": inner_own,
            "inner_imports_other": inner_other, "lines": lines}


def _inner_imports(node, inside: bool):
    """The import statements under ``node`` that sit inside a function (each once)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom) and inside:
            yield child
        yield from _inner_imports(child, inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))


class Walk:
    """The stays, climbs and handle.py visits of one traced call."""

    def __init__(self) -> None:
        self.stays: Counter = Counter()
        self.climbs: set = set()
        self.visits: set = set()
        self.resolved = 0

    def profile(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        path = code.co_filename
        if not path.startswith(str(PACKAGE)):
            return
        module = "cwlens." + ".".join(Path(path).relative_to(PACKAGE).with_suffix("").parts)
        if code.co_name in ("resolve_layers",):
            self.resolved += 1
        if not _holds_model(frame):
            return
        here = (module, code.co_qualname)
        below = _stay_below(frame.f_back)
        if module == "cwlens.engine.handle":
            caller = frame.f_back
            inside = caller is not None and caller.f_code.co_filename == path
            if below is not None and not inside:  # the handle's own calls are not visits
                self.visits.add((below, here))
            return
        self.stays[here] += 1
        if below is not None and layer_rank(module) > layer_rank(below[0]):
            self.climbs.add((below, here))

    def summary(self) -> dict:
        return {"stays": len(self.stays), "rooms": len({m for m, _ in self.stays}),
                "climbs": len(self.climbs), "handle_visits": len(self.visits),
                "layers_resolved": self.resolved}


def _holds_model(frame) -> bool:
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames[:n]
    if names and names[0] == "self" and _is_model(frame.f_locals.get("self")):
        names = names[1:]  # the model's own methods (tracr's network) are not stays
    return any(_is_model(frame.f_locals.get(name)) for name in names)


def _is_model(value) -> bool:
    """A TransformerLens model (a module with a ``cfg``: HookedTransformer, HookedEncoder,
    TransformerBridge, cwlens' tracr network) or its handle."""
    kind = type(value)
    return kind.__name__ == "ModelHandle" or (
        hasattr(value, "cfg") and any(k.__name__ == "Module" for k in kind.__mro__))


def _stay_below(frame):
    """The nearest frame down the stack that is a cwlens function holding the model."""
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(str(PACKAGE)) and _holds_model(frame) \
                and not path.endswith(os.path.join("engine", "handle.py")):
            module = "cwlens." + ".".join(Path(path).relative_to(PACKAGE).with_suffix("").parts)
            return module, frame.f_code.co_qualname
        frame = frame.f_back
    return None


def traced(call) -> Walk:
    walk = Walk()
    sys.setprofile(walk.profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return walk


def faithfulness_walk() -> Walk:
    from cwlens.datasets import TextSample
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
    from cwlens.testing import tiny_model

    model = tiny_model("llama")
    texts = [TextSample(f"walk-{i:04d}", "The quick brown fox jumps over the lazy dog again and again.", "walk")
             for i in range(2)]
    config = FaithfulnessConfig(rates=(0.1, 0.5))
    return traced(lambda: run_faithfulness(model, texts, config, progress=False))


def groundtruth_walk() -> Walk | None:
    try:
        import tracr  # noqa: F401  (optional: setup.sh --tracr)
    except ImportError:
        return None
    from cwlens.groundtruth import library
    from cwlens.groundtruth.evaluate import score_program

    program = library.load("frac_prevs")
    return traced(lambda: score_program(program, n_inputs=8, n_boot=199))


def table(counts: dict, walks: dict) -> str:
    rows = ["| count | value |", "|---|---:|",
            f"| `wrap(` calls in cwlens/ | {counts['wrap_calls']} |",
            f"| imports inside functions: cwlens' own | {counts['inner_imports_own']} |",
            f"| imports inside functions: other packages | {counts['inner_imports_other']} |",
            f"| lines of cwlens/ | {counts['lines']:,} |"]
    for name, walk in walks.items():
        if walk is None:
            rows.append(f"| {name} | (tracr not installed) |")
            continue
        s = walk.summary()
        rows.append(f"| {name}: stays (rooms) | {s['stays']} ({s['rooms']}) |")
        rows.append(f"| {name}: climbs | {s['climbs']} |")
        rows.append(f"| {name}: visits to handle.py | {s['handle_visits']} |")
        rows.append(f"| {name}: layers resolved | {s['layers_resolved']} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", help="write the table between the house-counts markers of this file")
    parser.add_argument("--list", action="store_true", help="also print every stay and climb")
    args = parser.parse_args(argv)
    counts = source_counts()
    walks = {"faithfulness walk (run_faithfulness)": faithfulness_walk(),
             "ground-truth walk (score_program)": groundtruth_walk()}
    text = table(counts, walks)
    print(text)
    if args.list:
        for name, walk in walks.items():
            if walk is None:
                continue
            print(f"\n{name}")
            for (module, fn), n in sorted(walk.stays.items()):
                print(f"  stay  {module}.{fn}  x{n}")
            for below, here in sorted(walk.climbs):
                print(f"  climb {below[0]}.{below[1]} -> {here[0]}.{here[1]}")
            for below, here in sorted(walk.visits):
                print(f"  visit {below[0]}.{below[1]} -> {here[1]}")
    if args.docs:
        path = Path(args.docs)
        doc = path.read_text()
        if START not in doc or END not in doc:
            raise SystemExit(f"error: {path} has no {START} ... {END} markers")
        head, rest = doc.split(START, 1)
        path.write_text(head + START + "\n" + text + "\n" + END + rest.split(END, 1)[1])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
