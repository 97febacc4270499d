"""Accuracy under masking where the clean model is above chance (cwlens.faithfulness.accuracy):
the exact interval against its definition, clean accuracy against unbatched float64
log-likelihoods, the chance gate, masks applied (rate 1 = every attention term removed),
and paired differences of the per-item accuracies."""

import math

import pytest
import torch

from cwlens.core.proportion import above_chance, clopper_pearson
from cwlens.datasets import ChoiceItem, TextSample
from cwlens.engine import hook_names
from cwlens.engine.adapter import ModelInfo
from cwlens.engine.handle import wrap
from cwlens.errors import CwlensError, InvalidArgumentError
from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
from cwlens.faithfulness.accuracy import (
    AtChanceError,
    CleanAccuracy,
    chance_level,
    clean_accuracy,
    item_accuracies,
    require_above_chance,
    run_accuracy_test,
)
from cwlens.testing import tiny_model

ITEMS = [
    ChoiceItem("t-0", ("mary gave john a bottle of",) * 3, (" milk", " water", " dog"), 0, "toy"),
    ChoiceItem("t-1", ("the capital of france is",) * 2, (" paris", " london"), 0, "toy"),
    ChoiceItem("t-2", ("one two three",) * 4, (" four", " five", " six", " ten"), 0, "toy"),
    ChoiceItem("t-3", ("when mary and john went to the store , john gave a drink to",) * 2,
               (" john", " mary"), 1, "toy"),
    ChoiceItem("t-4", ("the cat sat on the",) * 3, (" dog", " mat", " tree"), 1, "toy"),
    ChoiceItem("t-5", ("red blue green red blue",) * 3, (" red", " green", " big"), 1, "toy"),
    ChoiceItem("t-6", ("the big dog ran",) * 2, (" slow", " fast"), 1, "toy"),
    ChoiceItem("t-7", ("six seven eight",) * 2, (" nine", " two"), 0, "toy"),
]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def tail_at_least(k, n, p):  # P(X >= k), from the definition
    return math.fsum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))


def tail_at_most(k, n, p):  # P(X <= k)
    return math.fsum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k + 1))


@pytest.mark.parametrize("k, n", [(1, 5), (3, 8), (150, 300), (274, 300), (12, 207)])
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_clopper_pearson_solves_its_definition(k, n, level):
    low, high = clopper_pearson(k, n, level)
    alpha = 1 - level
    assert 0 < low < k / n < high < 1
    assert tail_at_least(k, n, low) == pytest.approx(alpha / 2, rel=1e-8)
    assert tail_at_most(k, n, high) == pytest.approx(alpha / 2, rel=1e-8)


def test_clopper_pearson_edges_and_bad_input():
    assert clopper_pearson(0, 10)[0] == 0.0 and clopper_pearson(10, 10)[1] == 1.0
    assert clopper_pearson(0, 10)[1] == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-10)
    assert clopper_pearson(10, 10)[0] == pytest.approx(0.025 ** (1 / 10), rel=1e-10)
    for bad in [(11, 10, 0.95), (1, 0, 0.95), (1, 10, 1.0), (True, 10, 0.95)]:
        with pytest.raises(InvalidArgumentError):
            clopper_pearson(*bad)
    assert above_chance(0.51, 0.5) and not above_chance(0.5, 0.5)


def hand_ll(model, context, continuation, hooks=()):
    ctx = model.to_tokens(context)[0].tolist()
    cont = model.tokenizer(continuation, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model.run_with_hooks(torch.tensor([ctx + cont]), fwd_hooks=list(hooks))
    logp = torch.log_softmax(logits[0].double(), -1)
    return math.fsum(float(logp[len(ctx) - 1 + t, tok]) for t, tok in enumerate(cont))


def reference(model, items, hooks=()):
    """``(acc, gold_ll)`` per item from unbatched float64 log-likelihoods (first index
    wins ties)."""
    acc, gold = [], []
    for item in items:
        lls = [hand_ll(model, c, x, hooks) for c, x in item.pairs]
        best = max(range(len(lls)), key=lambda c: (lls[c], -c))
        acc.append(float(best == item.gold))
        gold.append(lls[item.gold])
    return acc, gold


def test_clean_accuracy_against_unbatched_reference(model):
    expected, _ = reference(model, ITEMS)
    assert item_accuracies(wrap(model), ITEMS, batch_tokens=40) == expected
    check = clean_accuracy(model, ITEMS, batch_tokens=40)
    assert (check.n, check.correct) == (len(ITEMS), int(sum(expected)))
    assert check.chance == pytest.approx((1 / 3 + 1 / 2 + 1 / 4 + 1 / 2 + 1 / 3 + 1 / 3 + 1 / 2 + 1 / 2) / 8)
    assert (check.low, check.high) == clopper_pearson(check.correct, check.n)
    assert check.accuracy == check.correct / check.n
    # the sweep's clean rows are the same numbers
    table = run_faithfulness(model, ITEMS, FaithfulnessConfig(metrics=("random",), rates=(0.5,)),
                             progress=False).table
    clean = table[(table["mode"] == "clean") & (table["measure"] == "acc")]
    assert dict(zip(clean.sample_id, clean.value, strict=True)) == {
        i.id: a for i, a in zip(ITEMS, expected, strict=True)}


def test_chance_gate(model):
    at = CleanAccuracy("x", 300, 160, 0.5, *clopper_pearson(160, 300))
    above = CleanAccuracy("x", 300, 180, 0.5, *clopper_pearson(180, 300))
    assert at.verdict == "at chance" and above.verdict == "above chance"
    require_above_chance(above)
    with pytest.raises(AtChanceError) as info:
        require_above_chance(at)
    assert "53.3% [47.5, 59.1] (160/300), chance 50.0%: at chance" in str(info.value)
    assert "allow_chance=True" in str(info.value) and isinstance(info.value, CwlensError)
    assert chance_level(ITEMS[:2]) == pytest.approx(5 / 12)
    with pytest.raises(InvalidArgumentError, match="ChoiceItem"):
        clean_accuracy(model, [TextSample("d", "the cat", "toy")])  # (the model is checked first)


def test_run_refuses_at_chance(model):
    # 8 items with chance ~0.4: even 8/8 has p_L = 0.025**(1/8) = 0.63; a random tiny
    # model is far from that, so the clean check refuses before any masked pass
    check = clean_accuracy(model, ITEMS)
    assert not check.above_chance
    with pytest.raises(AtChanceError, match="at chance"):
        run_accuracy_test(model, ITEMS, FaithfulnessConfig(metrics=("random",), rates=(0.5,)),
                          progress=False)


def test_masks_applied_and_paired_differences(model):
    """At rate 1 every eligible attention term is removed, so each head writes nothing
    (z = 0): the masked acc and gold log-likelihood equal a run with hook_z zeroed."""
    cfg = FaithfulnessConfig(metrics=("attention", "contribution", "random"), rates=(0.3, 1.0),
                             modes=("comprehensiveness", "sufficiency"), batch_tokens=40)
    test = run_accuracy_test(model, ITEMS, cfg, allow_chance=True, progress=False)
    assert test.clean.n == len(ITEMS)
    table = test.result.table
    n_layers = ModelInfo.of(model).n_layers
    zero = [(hook_names.z(ly), lambda z, hook: torch.zeros_like(z)) for ly in range(n_layers)]
    acc, gold = reference(model, ITEMS, zero)
    for metric in cfg.metrics:
        for mode in cfg.modes:
            rows = table[(table.metric == metric) & (table["mode"] == mode) & (table.rate == 1.0)]
            got = rows.set_index(["measure", "sample_id"])["value"]
            assert [got[("acc", i.id)] for i in ITEMS] == acc
            assert [got[("gold_ll", i.id)] for i in ITEMS] == pytest.approx(gold, abs=1e-4)
    # paired difference of the faithfulness score (comprehensiveness: accuracy drop) of
    # contribution minus attention = mean over items of acc(attention) - acc(contribution)
    from cwlens.faithfulness.report import paired_comparisons

    pairs = paired_comparisons(table, "toy", "comprehensiveness", 0.3, "acc",
                               order=("attention", "contribution"))
    cell = table[(table["mode"] == "comprehensiveness") & (table.rate == 0.3) & (table.measure == "acc")]
    per = cell.pivot(index="sample_id", columns="metric", values="value")
    d = pairs[("attention", "contribution")]
    assert d.n == len(ITEMS)
    assert d.mean == pytest.approx(float((per["attention"] - per["contribution"]).mean()))
    assert d.low <= d.mean <= d.high


def test_accuracy_command_and_the_faithfulness_gate(tmp_path, capsys):
    from cwlens.cli.main import main
    from cwlens.datasets import load_dataset
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)
    md = tmp_path / "acc.md"
    argv = ["accuracy", "--model", str(model_dir), "--device", "cpu", "--dataset", "ioi,capitals",
            "--samples", "ioi=30,capitals=20", "--summary-md", str(md)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    tiny = tiny_model("llama")  # the same weights (seed 0)
    for name, n in (("ioi", 30), ("capitals", 20)):
        assert clean_accuracy(tiny, load_dataset(name, n)).line() in out
    text = md.read_text()
    assert text.startswith("<!-- clean-accuracy:start -->") and "| ioi | 30 |" in text
    # faithfulness --require-above-chance: a random tiny model is at chance on 20 items
    argv = ["faithfulness", "--model", str(model_dir), "--device", "cpu", "--dataset", "capitals",
            "--samples", "20", "--rates", "0.5", "--metrics", "attention", "--out",
            str(tmp_path / "runs"), "--figures", "", "--no-progress", "--require-above-chance"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "clean accuracy: capitals:" in captured.out and "at chance" in captured.err
    assert not (tmp_path / "runs" / "capitals.jsonl").exists()


def test_accuracy_cells_have_the_exact_interval_of_the_clean_check(model):
    """A cell of per-item 0/1 accuracies is a proportion: its interval is Clopper–Pearson
    (k of n), the one the clean check prints, always inside [0, 1]. The bootstrap-t of 0/1
    values left it (SmolLM2, capitals, 18/20: [79.6, 100.4]) and was [1, 1] at n of n."""
    import pandas as pd

    from cwlens.faithfulness.report import markdown_tables
    from cwlens.faithfulness.results import summarize

    cfg = FaithfulnessConfig(metrics=("attention", "contribution"), rates=(0.3,), batch_tokens=40)
    test = run_accuracy_test(model, ITEMS, cfg, allow_chance=True, progress=False)
    table = test.result.table
    summary = summarize(table)
    acc = summary[summary.measure == "acc"]
    assert len(acc) == 1 + 2 * 2  # clean, 2 metrics x 2 modes
    for _, cell in acc.iterrows():
        rows = table[(table.measure == "acc") & (table.metric == cell.metric) & (table["mode"] == cell["mode"])]
        k = int(rows.value.sum())
        assert (cell.ci_low, cell.ci_high) == clopper_pearson(k, len(ITEMS))
        assert 0 <= cell.ci_low <= cell["mean"] <= cell.ci_high <= 1
    clean = acc[acc["mode"] == "clean"].iloc[0]
    assert (clean.ci_low, clean.ci_high) == (test.clean.low, test.clean.high)
    md = markdown_tables(summary, table)
    assert "accuracy, %, mean [exact 95% CI (Clopper–Pearson)]" in md
    # all correct / all wrong: the one-sided exact ends, not a point
    rows = [{"model": "m", "dataset": "toy", "metric": "attention", "mode": "comprehensiveness",
             "rate": 0.3, "layers": "all", "sample_id": f"s{i}", "measure": "acc", "value": v}
            for v in (0.0, 1.0) for i in range(20)]
    for v in (0.0, 1.0):
        cell = summarize(pd.DataFrame([r for r in rows if r["value"] == v])).iloc[0]
        assert (cell.ci_low, cell.ci_high) == clopper_pearson(int(20 * v), 20)
    # other measures (a log-likelihood) keep the bootstrap-t interval of the mean
    ll = summary[(summary.measure == "gold_ll") & (summary["mode"] == "clean")].iloc[0]
    assert ll.ci_low < ll["mean"] < ll.ci_high


def test_markdown_rows_keep_their_columns_with_a_pipe_in_a_label():
    """``|attn×grad| (sup.)`` in a table cell split its row into extra columns."""
    import random
    import re

    import pandas as pd

    from cwlens.faithfulness import aopc
    from cwlens.faithfulness.report import markdown_tables
    from cwlens.faithfulness.results import summarize

    rng = random.Random(0)
    rows = [{"model": "m", "dataset": "toy", "metric": metric, "mode": mode, "rate": rate,
             "layers": "all", "sample_id": f"s{i}", "measure": "acc", "value": float(rng.random() < 0.6)}
            for metric in ("contribution", "attention_gradient_abs") for mode in ("comprehensiveness", "sufficiency")
            for rate in (0.1, 0.3, 0.5) for i in range(12)]
    rows += [{**rows[i], "metric": "none", "mode": "clean", "rate": 0.0, "value": 1.0} for i in range(12)]
    table = pd.DataFrame(rows)
    per_sample = aopc.aopc(aopc.damages(table, "acc"))
    texts = [markdown_tables(summarize(table), table),
             aopc.markdown(aopc.aopc_summary(per_sample), "acc", aopc.verdicts(per_sample))]
    for text in texts:
        lines = [ln for ln in text.splitlines() if ln.startswith("|")]
        assert any("attn×grad" in ln for ln in lines)
        breaks = {len(re.findall(r"(?<!\\)\|", ln)) for ln in lines}
        assert len(breaks) == 1, lines


def _yes_no(n_yes, n_no):
    ctx = ("passage. question?",) * 2
    return ([ChoiceItem(f"y-{i}", ctx, (" no", " yes"), 1, "yn") for i in range(n_yes)]
            + [ChoiceItem(f"n-{i}", ctx, (" no", " yes"), 0, "yn") for i in range(n_no)])


def test_chance_is_the_better_of_guessing_and_a_constant_answer():
    """63% "yes" rows: always answering yes scores 63%, so that is the bar, not 50%; a
    model at 65% of 500 (interval [60.6, 69.2]) is then at chance."""
    from cwlens.faithfulness.accuracy import constant_answer, uniform_chance

    items = _yes_no(315, 185)
    assert constant_answer(items) == (" yes", 0.63) and uniform_chance(items) == 0.5
    assert chance_level(items) == 0.63
    low, high = clopper_pearson(325, 500)
    assert low > 0.5  # above the uniform bar ...
    check = CleanAccuracy("yn", 500, 325, chance_level(items), low, high, constant=" yes")
    assert check.verdict == "at chance"  # ... but not above always-yes
    assert "chance 63.0% (always answering 'yes'): at chance" in check.line()
    # items with their own answers (capitals, IOI) share none: uniform guessing stays the bar
    assert constant_answer(ITEMS) == (None, 0.0)
    assert chance_level(ITEMS) == uniform_chance(ITEMS)
    # an answer offered twice in an item (Winogrande's partial scoring) is no constant answer
    twice = [ChoiceItem("w", ("a _", "b _"), (" x", " x"), 0, "w")] * 3
    assert constant_answer(twice) == (None, 0.0) and chance_level(twice) == 0.5


def test_clean_accuracy_reports_the_constant_answer(model):
    items = _yes_no(21, 3)
    check = clean_accuracy(model, items, batch_tokens=40)
    assert check.chance == 7 / 8 and check.constant == " yes"
    # on few items the answer picked after seeing the golds overstates chance (one item:
    # 100%, "always answering 'Robert'"): uniform guessing, and the line says why
    few = clean_accuracy(model, _yes_no(7, 1), batch_tokens=40)
    assert few.chance == 0.5 and few.constant is None and chance_level(_yes_no(7, 1)) == 0.5
    assert "chance 50.0% (uniform guessing: with fewer than 20 items" in few.line()
    assert chance_level(_yes_no(1, 0)) == 0.5


def test_choice_passes_unembed_only_the_continuations_and_score_as_full_logits(model, monkeypatch):
    """Multiple-choice passes skip the unembedding and unembed the continuation positions
    only, in one product per pass (lm.Picked); every row equals the full-logits path's (acc exactly, gold_ll to
    float32 rounding), and the clean gold_ll the unbatched float64 reference."""
    from dataclasses import replace

    import cwlens.faithfulness.sweep as sweep_mod
    from cwlens.engine.handle import wrap

    cfg = FaithfulnessConfig(metrics=("attention", "contribution", "random"), rates=(0.1, 0.5))
    calls = []
    handle = wrap(model)
    real = handle.logits_of
    monkeypatch.setattr(handle, "logits_of", lambda r: calls.append(tuple(r.shape)) or real(r))
    result = run_faithfulness(model, ITEMS, cfg, progress=False)
    few = result.table
    # one product per pass, of the continuations' positions only (at most 3 tokens per choice)
    n_positions = sum(len(i.pairs) for i in ITEMS) * 3
    assert len(calls) == result.stats.n_forwards and all(s[0] == 1 and s[1] <= n_positions for s in calls)
    plain = sweep_mod.choice_units
    monkeypatch.setattr(sweep_mod, "choice_units",
                        lambda m, items, *bos: [replace(u, positions=None) for u in plain(m, items, *bos)])
    full = run_faithfulness(model, ITEMS, cfg, progress=False).table
    assert (few.drop(columns="value") == full.drop(columns="value")).all().all()
    exact = few.measure.isin(["acc", "acc_norm", "tied_share", "first_token_share"])
    import pandas as pd

    pd.testing.assert_series_equal(few.value[exact], full.value[exact], check_exact=True)  # NaN = NaN
    torch.testing.assert_close(torch.tensor(few.value[~exact].to_numpy()),
                               torch.tensor(full.value[~exact].to_numpy()), rtol=1e-5, atol=1e-5)
    _, gold = reference(model, ITEMS)
    clean = few[(few["mode"] == "clean") & (few["measure"] == "gold_ll")].set_index("sample_id").value
    torch.testing.assert_close(torch.tensor([clean[i.id] for i in ITEMS]), torch.tensor(gold, dtype=torch.float64),
                               rtol=1e-5, atol=1e-5)


def test_accuracy_refuses_an_encoder(tmp_path, capsys):
    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    enc = save_tiny("bert", tmp_path)
    assert main(["accuracy", "--model", str(enc), "--device", "cpu", "--dataset", "capitals",
                 "--samples", "5"]) == 1
    assert "this model is an encoder" in capsys.readouterr().err



def test_a_choice_item_past_the_context_is_refused_not_cut(model):
    """A 5-shot prompt past n_ctx was cut with its answer ("choice 0 has an empty
    continuation"); one just under it would have had its answer cut short and scored."""
    from cwlens.errors import InputTooLongError
    from cwlens.faithfulness.choice import encode_pair
    from cwlens.faithfulness.units import choice_units

    n_ctx = model.cfg.n_ctx
    long_ctx = " ".join(["the cat sat on the mat ."] * (n_ctx // 7 + 2))
    ctx, cont = encode_pair(wrap(model), long_ctx, " the cat sat")
    assert len(ctx) > n_ctx and len(cont) == 3  # whole, not cut at n_ctx
    item = ChoiceItem("long", (long_ctx, long_ctx), (" the cat sat", " a dog"), 0, "t")
    with pytest.raises(InputTooLongError, match="more than the model's context"):
        choice_units(wrap(model), [item])


class _Stop(Exception):
    pass


def _rows_run(model):
    """Number of sequences each forward of ``model`` is given (a list per call)."""
    seen: list[int] = []
    handle = model.register_forward_hook(lambda m, args, out: seen.append(len(args[0]))
                                         if args else None)
    return seen, handle


def test_a_resumed_run_reads_the_clean_accuracy_of_its_written_items(model, tmp_path):
    """The clean check of a rerun that resumes ``out`` reads the items already written
    from their clean ``acc`` rows and runs only the others; its numbers equal a fresh
    check's. Rows of another configuration, or resume=False, are not read."""
    from cwlens.faithfulness.accuracy import written_accuracies

    cfg = FaithfulnessConfig(metrics=("random",), rates=(0.5,), batch_tokens=40)
    out = tmp_path / "toy.jsonl"
    done: list[str] = []

    def stop_after_three(sample_id):
        done.append(sample_id)
        if len(done) == 3:
            raise _Stop

    with pytest.raises(_Stop):
        run_faithfulness(model, ITEMS, cfg, out=out, progress=False, on_sample=stop_after_three)
    fresh = clean_accuracy(model, ITEMS, batch_tokens=40)
    expected = dict(zip((i.id for i in ITEMS), item_accuracies(wrap(model), ITEMS, 40), strict=True))
    written = written_accuracies(wrap(model), ITEMS, cfg, out)
    assert sorted(written) == sorted(done) and {k: expected[k] for k in written} == written
    # only the items not written are run
    seen, handle = _rows_run(model)
    try:
        check = clean_accuracy(model, ITEMS, batch_tokens=40, known=written)
        n_partial = sum(seen)
        seen.clear()
        clean_accuracy(model, ITEMS, batch_tokens=40, known=expected)
        n_none = sum(seen)
        seen.clear()
        clean_accuracy(model, ITEMS, batch_tokens=40)
        n_all = sum(seen)
    finally:
        handle.remove()
    assert (check.correct, check.n, check.low, check.high, check.line()) == \
        (fresh.correct, fresh.n, fresh.low, fresh.high, fresh.line())
    assert (check.reused, fresh.reused) == (3, 0)
    assert n_none == 0 < n_partial < n_all
    # another configuration (here its rates) would not resume from these rows: none read
    other = FaithfulnessConfig(metrics=("random",), rates=(0.3,), batch_tokens=40)
    assert written_accuracies(wrap(model), ITEMS, other, out) == {}
    assert written_accuracies(wrap(model), ITEMS[:5], cfg, out) == {}  # other samples
    assert written_accuracies(wrap(model), ITEMS, cfg, tmp_path / "none.jsonl") == {}
    with pytest.raises(InvalidArgumentError, match="other than 0 or 1"):
        clean_accuracy(model, ITEMS, known={"t-0": 0.5})
    # run_accuracy_test resumes: the clean check reads the 3, then all 8
    test = run_accuracy_test(model, ITEMS, cfg, allow_chance=True, out=out, progress=False)
    assert (test.clean.reused, test.clean.correct) == (3, fresh.correct)
    again = run_accuracy_test(model, ITEMS, cfg, allow_chance=True, out=out, progress=False)
    assert (again.clean.reused, again.clean.correct) == (len(ITEMS), fresh.correct)
    afresh = run_accuracy_test(model, ITEMS, cfg, allow_chance=True, out=out, resume=False,
                               progress=False)
    assert (afresh.clean.reused, afresh.clean.correct) == (0, fresh.correct)


def test_the_gate_of_a_resumed_command_reads_its_written_items(tmp_path, capsys, monkeypatch):
    """cwlens faithfulness --require-above-chance, rerun on its --out: the clean line is
    the same and says how many items it read from the results file; --no-resume reads none."""
    import cwlens.faithfulness.accuracy as accuracy
    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    monkeypatch.setattr(accuracy, "require_above_chance", lambda check: None)  # a random model
    model_dir = save_tiny("llama", tmp_path)
    argv = ["faithfulness", "--model", str(model_dir), "--device", "cpu", "--dataset", "capitals",
            "--samples", "20", "--rates", "0.5", "--metrics", "attention", "--out",
            str(tmp_path / "runs"), "--figures", "", "--no-progress", "--require-above-chance"]

    def clean_line(args):
        assert main(args) == 0
        return next(x for x in capsys.readouterr().out.splitlines() if x.startswith("clean accuracy:"))

    first = clean_line(argv)
    second = clean_line(argv)
    results = tmp_path / "runs" / "capitals.jsonl"
    assert "read from" not in first
    assert second == f"{first} (20 of them read from {results})"
    assert clean_line([*argv, "--no-resume"]) == first
