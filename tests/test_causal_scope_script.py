"""#39.8: ``scripts/causal_scope_check.py --non-causal`` printed +0.0000 where the docs say
-5.81 / +5.33 nats: it patched a module the masks no longer used. The contrast is real
again: the earlier (non-causal) head/layer masks read the scored tokens, the causal ones
do not, and the script refuses to print a contrast its patch did not reach."""

import contextlib
import importlib.util
from pathlib import Path

import pytest

from cwlens.testing import tiny_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "causal_scope_check.py"
TEXT = "the cat sat on the mat and the dog ran to the big red house when the sun was up"


def _script():
    spec = importlib.util.spec_from_file_location("causal_scope_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run():
    return _script(), tiny_model("llama")


@pytest.mark.parametrize("scope", ["head", "layer"])
def test_non_causal_masks_read_the_future_and_causal_ones_do_not(run, scope):
    script, model = run
    kw = dict(n_context=4, n_scored=8, text=TEXT, rate=0.3)
    whole, steps = script.check(model, scope, non_causal=True, **kw)
    assert abs(whole - steps) > 1e-3  # the old masks: a whole continuation sees its future
    whole, steps = script.check(model, scope, non_causal=False, **kw)
    assert whole == pytest.approx(steps, abs=1e-4)


def test_the_patch_must_reach_the_masks(run, monkeypatch):
    """If the masks stop going through job_masks.causal_ranking, the script raises
    instead of printing a difference of 0."""
    script, model = run
    from cwlens.faithfulness import job_masks

    monkeypatch.setattr(job_masks, "causal_ranking", lambda r: r)  # what leaking_masks replaces
    monkeypatch.setattr(script, "leaking_masks", lambda: contextlib.nullcontext([]))
    with pytest.raises(RuntimeError, match="did not reach the head-scope masks"):
        script.check(model, "head", non_causal=True, n_context=4, n_scored=8, text=TEXT)
