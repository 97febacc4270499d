"""The bound model handle: the one place that knows TransformerLens models.

Outside :mod:`cwlens.engine.handle` and :mod:`cwlens.engine.models`, no module reads ``model.cfg``,
checks ``type(model).__name__``, adds hooks with the model's own ``hooks(...)`` or reads
``hook_dict``; ``run_with_cache`` and ``names_filter`` are defined once.
"""

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

import cwlens
from cwlens.engine import hook_names
from cwlens.engine.handle import ModelHandle, ModelInfo, wrap
from cwlens.testing import tiny_model

PACKAGE = Path(cwlens.__file__).parent
HANDLE_MODULES = {PACKAGE / "engine" / "handle.py"}
FORBIDDEN = {
    "model.cfg": re.compile(r"\bmodel\.cfg\b"),
    "type(model).__name__": re.compile(r"type\(\s*model\s*\)\.__name__"),
    "model.hooks(": re.compile(r"\bmodel\.hooks\("),
    ".hooks(fwd_hooks=": re.compile(r"\.hooks\(\s*fwd_hooks\s*="),
    "hook_dict": re.compile(r"hook_dict"),
}


def _package_files():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in HANDLE_MODULES or (PACKAGE / "engine" / "models") in path.parents:
            continue
        yield path


def _entry_lines(text: str) -> set[int]:
    """The lines of the functions marked ``@takes_model``: their ``model`` is the handle, so
    ``model.hooks(`` there is the handle's (every other pattern is still refused)."""
    return {n for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef)
            and any(getattr(d, "id", None) == "takes_model" for d in node.decorator_list)
            for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}


def test_no_model_internals_outside_the_handle():
    found = []
    for path in _package_files():
        text = path.read_text(encoding="utf-8")
        handles = _entry_lines(text)
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(PACKAGE)}:{number}: {what}"
                      for what, pattern in FORBIDDEN.items() if pattern.search(line)
                      and not (what == "model.hooks(" and number in handles)]
    assert found == [], "ask cwlens.engine.handle.wrap(model) instead:\n" + "\n".join(found)


def _definitions(name: str) -> list[str]:
    """Functions called ``name`` anywhere in the package (nested ones too), except the
    method stubs of typing Protocols (which describe TransformerLens' own methods) and the
    models cwlens builds itself (cwlens.engine.models: a model defines TransformerLens'
    ``run_with_cache`` as a method of its own)."""
    where = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "engine" / "models") in path.parents:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        stubs = {
            id(item)
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any(getattr(base, "id", None) == "Protocol" for base in node.bases)
            for item in node.body
        }
        where += [f"{path.relative_to(PACKAGE)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.name == name and id(node) not in stubs]
    return where


@pytest.mark.parametrize("name", ["run_with_cache", "names_filter"])
def test_run_with_cache_and_names_filter_are_defined_once(name):
    assert _definitions(name) == [f"engine/measures.py:{_line_of(name)}"]


def _line_of(name: str) -> int:
    source = (PACKAGE / "engine" / "measures.py").read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(source, 1) if line.startswith(f"def {name}("))


def test_the_handle_is_made_once_and_is_no_part_of_the_module():
    model = tiny_model("llama")
    keys = set(model.state_dict())
    handle = wrap(model)
    assert wrap(model) is handle and wrap(handle) is handle and handle.model is model
    assert set(model.state_dict()) == keys  # not a submodule, parameter or buffer
    assert cwlens.wrap(model) is handle  # the public name


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
def test_the_handle_answers_what_the_model_says(arch):
    model = tiny_model(arch)
    handle = wrap(model)
    cfg = model.cfg
    assert (handle.n_layers, handle.n_heads, handle.d_vocab) == (cfg.n_layers, cfg.n_heads, cfg.d_vocab)
    assert handle.is_encoder == (arch == "bert") == wrap(model).is_encoder
    for layer in range(handle.n_layers):
        torch.testing.assert_close(handle.W_O(layer), model.blocks[layer].attn.W_O.detach(), rtol=0, atol=0)
        assert handle.b_O(layer).shape == (cfg.d_model,)
    before = handle.n_hooks()  # the bridge keeps some hooks of its own on BERT
    with handle.hooks([(hook_names.pattern(0), lambda x, hook: x)]):
        assert handle.n_hooks() == before + 1
    assert handle.n_hooks() == before


def test_the_handle_sees_a_config_edited_after_wrapping():
    model = tiny_model("llama")
    handle = wrap(model)
    n = model.cfg.n_layers
    model.cfg.n_layers = n - 1
    try:
        assert handle.n_layers == n - 1
    finally:
        model.cfg.n_layers = n


def test_circuits_run_with_cache_is_the_one_run_with_cache():
    """``cwlens.circuits.run_with_cache`` keeps exactly what the circuit tools read, and
    its cache equals the plain one on every hook they share."""
    from cwlens import circuits

    model = tiny_model("llama")
    tokens = torch.tensor([[1, 5, 9, 11, 3]])
    logits, cache = circuits.run_with_cache(model, tokens)
    n = model.cfg.n_layers
    want = set(hook_names.needed(range(n)))
    for layer in range(n):
        want |= {hook_names.resid_pre(layer), hook_names.resid_mid(layer),
                 hook_names.mlp_out(layer)}
    want |= {hook_names.resid_post(n - 1), hook_names.final_scale()}
    assert set(cache.keys()) == want and not logits.requires_grad
    plain_logits, plain = cwlens.run_with_cache(model, tokens)
    torch.testing.assert_close(logits, plain_logits.detach())
    for name in plain.keys():
        torch.testing.assert_close(cache[name], plain[name])


def test_a_handle_is_accepted_where_a_model_is():
    model = tiny_model("llama")
    tokens = torch.tensor([[1, 5, 9, 11, 3]])
    _, cache = cwlens.run_with_cache(model, tokens)
    by_model = cwlens.contribution_weights(cache, model, layer=0)
    by_handle = cwlens.contribution_weights(cache, wrap(model), layer=0)
    torch.testing.assert_close(by_model, by_handle, rtol=0, atol=0)
    assert isinstance(wrap(model), ModelHandle)


def test_the_adapter_forwards_nothing_to_the_handle():
    """adapter.py holds the cache and layer checks, not one-line forwarders
    ``return wrap(model).X`` to the handle: callers ask the handle (issue 49)."""
    import inspect

    from cwlens.engine import adapter

    def statements(f):
        return [s for s in f.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]

    tree = ast.parse(inspect.getsource(adapter))
    forwarders = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and len(statements(f)) == 1
                  and isinstance(statements(f)[0], ast.Return) and "wrap(" in ast.unparse(statements(f)[0])]
    assert forwarders == []


def test_a_sweep_resolves_its_layers_once(monkeypatch):
    """run_faithfulness resolves its layers once; the streamed passes below it take them
    resolved (cwlens.engine.streaming.geometry_pass), whatever the number of batches."""
    from cwlens.datasets import TextSample
    from cwlens.engine import adapter
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness

    model = tiny_model("llama")
    calls = []
    real = adapter.resolve_layers
    monkeypatch.setattr(adapter, "resolve_layers", lambda *a, **k: calls.append(1) or real(*a, **k))
    texts = [TextSample(f"t-{i:04d}", "the cat sat on the mat " * (i + 1), "t") for i in range(3)]
    cfg = FaithfulnessConfig(metrics=("attention", "contribution"), rates=(0.5,), batch_tokens=8)
    run_faithfulness(model, texts, cfg, progress=False)
    assert len(calls) == 1


def _model_walk():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "model_walk.py"
    spec = importlib.util.spec_from_file_location("model_walk", path)
    assert spec is not None and spec.loader is not None
    walk_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walk_module)
    return walk_module


def test_the_faithfulness_walk_does_not_grow():
    """scripts/model_walk.py's trace of run_faithfulness (docs/architecture.md): the model
    never climbs back up a layer, the layers are resolved once, the functions it is handed
    to are at most issue 49's 12 (45 before the handle was passed down; the checks take the
    model's facts, :class:`~cwlens.engine.handle.ModelInfo`), and they ask handle.py for the
    handle in at most today's 1 place (17 before)."""
    walk = _model_walk().faithfulness_walk().summary()
    assert walk["climbs"] == 0 and walk["layers_resolved"] == 1, walk
    assert walk["stays"] <= 12 and walk["handle_visits"] <= 1, walk


def test_the_checks_take_the_model_facts_not_the_model():
    """The entry checks read a :class:`ModelInfo` (no model needed), and a handle's info
    says what the handle says."""
    from cwlens.engine.adapter import require_next_token_model, resolve_layers
    from cwlens.engine.batching import check_past_context, context_cap
    from cwlens.errors import CwlensWarning, UnsupportedModelError, UsageError

    info = ModelInfo(n_layers=4, n_heads=2, n_kv_heads=2, d_head=8, d_model=16, generation="hooked",
                     post_attn_norm=False, is_encoder=True, rotary=False, n_ctx=32, name="m")
    with pytest.raises(UnsupportedModelError, match="this model is an encoder"):
        require_next_token_model(info, "The test", "Use a decoder.")
    with pytest.raises(UsageError, match="but m has learned position embeddings .* of 32 tokens"):
        check_past_context(info, True)
    with pytest.warns(CwlensWarning, match="1 of the 2 texts is longer .* of 32 tokens"):
        assert context_cap(info, 100, [10, 40]) == 32
    assert context_cap(info, 20, [10, 40]) == 20
    assert resolve_layers(info.n_layers, -1) == ([3], True)
    model = tiny_model("llama")
    handle = wrap(model)
    facts = handle.info
    assert (facts.is_encoder, facts.rotary, facts.n_ctx, facts.name) == (
        handle.is_encoder, handle.rotary_positions, handle.context_length(), handle.name)
    require_next_token_model(facts, "The test", "Use a decoder.")  # a decoder: no error


def test_the_handle_is_fetched_at_entry_points_only():
    """No function handed the handle (a parameter named ``handle``) wraps what it was
    handed (``wrap(`` of one of its parameters; wrapping a model it made, a float64 copy,
    is making a handle), and the ``wrap(`` calls of cwlens/ do not grow past today's 11 (102 before
    issue 49; 58 with one per public function): the public functions are marked
    ``@takes_model`` (cwlens.engine.entry), which wraps for them."""
    again = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            params = {a.arg for a in node.args.args + node.args.kwonlyargs}
            if "handle" not in params:
                continue
            again += [f"{path.relative_to(PACKAGE)}:{call.lineno} {node.name}"
                      for call in ast.walk(node) if isinstance(call, ast.Call)
                      and isinstance(call.func, ast.Name) and call.func.id == "wrap"
                      and any(isinstance(n, ast.Name) and n.id in params
                              for arg in call.args for n in ast.walk(arg))]
    assert not again, again
    assert _model_walk().source_counts()["wrap_calls"] <= 11


def test_an_entry_hands_its_body_the_handle():
    """@takes_model: the body gets the handle, the model given by position or by name (or
    the handle itself); the public signature says a model may be passed; a non-model is
    refused with wrap's error; the name, docstring and module are the function's own."""
    from cwlens.engine.entry import ModelLike, takes_model
    from cwlens.errors import InvalidArgumentError

    @takes_model
    def probe(cache, model: ModelLike, layer=None):
        """A probe."""
        return model

    model = tiny_model("llama")
    handle = wrap(model)
    assert probe(None, model) is handle and probe(None, model=model, layer=1) is handle
    assert probe(None, handle) is handle
    signature = inspect.signature(probe)
    assert signature.parameters["model"].annotation == ModelLike
    assert list(signature.parameters) == ["cache", "model", "layer"]
    assert (probe.__name__, probe.__doc__, probe.__module__) == ("probe", "A probe.", __name__)
    with pytest.raises(InvalidArgumentError, match="arguments swapped"):
        probe(None, cwlens.run_with_cache(model, "the cat")[1])
    with pytest.raises(ValueError):
        takes_model(lambda cache, layer: None)  # no model to take
    public = inspect.signature(cwlens.contribution_weights).parameters["model"]
    assert public.annotation == ModelLike  # what help() and the docs show


def test_a_long_text_counts_every_token_and_runs_blockwise():
    """``handle.n_tokens`` of a text past the context is its whole length (the forward runs
    every token: validation.run_input), so ``attention="auto"`` decides on that length."""
    from cwlens.engine import streaming

    handle = wrap(tiny_model("llama"))
    text = "the cat sat on the mat " * 700
    n = handle.n_tokens(text)
    assert n == len(handle.token_ids(text, truncate=False)) > handle.context_length()
    assert handle.n_tokens([text, "a dog"]) == n
    assert handle.n_tokens(torch.zeros(2, 7)) == 7
    assert streaming.use_blockwise(handle, text, "auto") == (
        handle.supports_blockwise and n > streaming.AUTO_THRESHOLD)
