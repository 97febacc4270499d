"""No function in cwlens takes more than 8 named parameters (``*args`` / ``**kwargs``
not counted, as pylint's too-many-arguments counts): more means a configuration record
is missing (:class:`~cwlens.faithfulness.config.FaithfulnessConfig`,
:class:`~cwlens.sinks.config.SinkConfig`)."""

import ast
from pathlib import Path

import cwlens

PACKAGE = Path(cwlens.__file__).parent
LIMIT = 8


def _named_parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)


def test_no_function_takes_more_than_eight_parameters():
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = _named_parameters(node)
                if n > LIMIT:
                    over.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}() takes {n}")
    assert over == [], "group these parameters into a configuration record:\n" + "\n".join(over)


def test_the_check_counts_what_it_says():
    tree = ast.parse("def f(a, b, /, c, *args, d, e=1, **kw): pass")
    assert _named_parameters(tree.body[0]) == 5  # a, b, c, d, e
