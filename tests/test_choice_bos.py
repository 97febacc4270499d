"""#39.8: multiple-choice accuracy reads each choice after the BOS token TransformerLens
prepends (SmolLM2 capitals, first 40 items: 36/40 with it, 38/40 without). That is
stated where the accuracy is defined, and ``prepend_bos=False`` (CLI ``--no-bos``) scores
a model trained without one; both settings equal the log-likelihoods computed by hand."""

from dataclasses import replace

import pytest
import torch

from cwlens.datasets import load_dataset
from cwlens.engine.handle import wrap
from cwlens.faithfulness import choice
from cwlens.faithfulness.accuracy import clean_accuracy, item_accuracies
from cwlens.faithfulness.sweep import FaithfulnessConfig, run_faithfulness, stored_config
from cwlens.testing import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _by_hand(model, item, prepend_bos: bool) -> float:
    """1.0 if the gold choice has the largest summed log-likelihood, each choice read from
    ``to_tokens(context + continuation, prepend_bos=...)`` in its own forward pass."""
    lls = []
    for context, continuation in item.pairs:
        n_spaces = len(context) - len(context.rstrip())  # lm-eval moves them to the continuation
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        ctx = model.to_tokens(context, prepend_bos=prepend_bos)[0]
        whole = model.to_tokens(context + continuation, prepend_bos=prepend_bos)
        with torch.no_grad():
            logp = model(whole).double().log_softmax(-1)[0]
        targets = whole[0, len(ctx):]
        lls.append(float(logp[len(ctx) - 1 : -1].gather(-1, targets[:, None]).sum()))
    best = max(range(len(lls)), key=lambda c: (lls[c], -c))
    return float(best == item.gold)


@pytest.mark.parametrize("prepend_bos", [True, False])
def test_both_settings_equal_the_log_likelihoods_by_hand(model, prepend_bos):
    items = load_dataset("capitals", n=12) + load_dataset("ioi", n=12)
    got = item_accuracies(wrap(model), items, prepend_bos=prepend_bos)
    assert got == [_by_hand(model, item, prepend_bos) for item in items]


def test_no_bos_drops_exactly_the_leading_bos(model):
    bos = model.tokenizer.bos_token_id
    item = load_dataset("capitals", n=1)[0]
    context, continuation = item.pairs[0]
    with_bos = choice.encode_pair(wrap(model), context, continuation)
    without = choice.encode_pair(wrap(model), context, continuation, prepend_bos=False)
    assert with_bos[0][0] == bos and with_bos[0][1:] == without[0] and without[0][0] != bos
    assert with_bos[1] == without[1]  # the same continuation tokens


def test_the_setting_is_recorded_only_when_it_is_not_the_default(model):
    """Results written before the option (with the BOS) keep resuming; a run without it
    cannot resume one with it."""
    items = load_dataset("capitals", n=2)
    ids = [i.id for i in items]
    assert "prepend_bos" not in stored_config("m", "capitals", FaithfulnessConfig(), ids)
    assert stored_config("m", "capitals", FaithfulnessConfig(prepend_bos=False), ids)["prepend_bos"] is False
    cfg = FaithfulnessConfig(metrics=("attention",), rates=(0.5,), modes=("comprehensiveness",))
    clean = {}
    for bos in (True, False):
        res = run_faithfulness(model, items, replace(cfg, prepend_bos=bos), progress=False)
        rows = res.table
        clean[bos] = rows[(rows["mode"] == "clean") & (rows["measure"] == "gold_ll")]["value"].tolist()
    assert clean[True] != clean[False]  # the sweep reads the setting too
    assert clean[False] == pytest.approx([
        _gold_ll(model, item, prepend_bos=False) for item in items])


def _gold_ll(model, item, prepend_bos):
    ctx, cont = choice.encode_pair(wrap(model), *item.pairs[item.gold], prepend_bos=prepend_bos)
    whole = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = model(whole).double().log_softmax(-1)[0]
    return float(logp[len(ctx) - 1 : -1].gather(-1, torch.tensor(cont)[:, None]).sum())


def test_cli_no_bos(tmp_path, capsys):
    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)
    items = load_dataset("capitals", n=20)
    tiny = tiny_model("llama")  # the same weights (seed 0)
    for flag, bos in (([], True), (["--no-bos"], False)):
        argv = ["accuracy", "--model", str(model_dir), "--device", "cpu", "--dataset", "capitals",
                "--samples", "20", "--no-progress", *flag]
        assert main(argv) == 0
        assert clean_accuracy(tiny, items, prepend_bos=bos).line() in capsys.readouterr().out


def test_smollm2_capitals_with_and_without_bos(smollm2):
    items = load_dataset("capitals", n=40)
    assert clean_accuracy(smollm2, items).correct == 36
    assert clean_accuracy(smollm2, items, prepend_bos=False).correct == 38


def test_cli_faithfulness_chance_check_reads_no_bos(tmp_path, monkeypatch):
    """``cwlens faithfulness --require-above-chance --no-bos``: the clean check that gates the
    run scores without the BOS too (it read every choice after one whatever the flag)."""
    from cwlens.cli.main import main
    from cwlens.faithfulness import accuracy
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)
    seen = []
    real = accuracy.clean_accuracy

    def spy(*args, **kwargs):
        seen.append(kwargs.get("prepend_bos", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(accuracy, "clean_accuracy", spy)
    for flag in ([], ["--no-bos"]):
        argv = ["faithfulness", "--model", str(model_dir), "--device", "cpu", "--dataset",
                "capitals", "--samples", "8", "--require-above-chance", "--no-progress",
                "--metrics", "attention", "--rates", "0.5", "--out", str(tmp_path / f"r{len(flag)}"),
                *flag]
        main(argv)  # the tiny model is at chance: exit 1 after the check
    assert seen == [True, False]
