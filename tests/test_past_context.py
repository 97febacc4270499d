"""``--past-context`` (``past_context=True``): the long-text surfaces run texts past the
model's context on rotary models, with one note, and refuse it on learned-position models
(one line, exit 2). Tiny models: n_ctx 128; rotary (llama) and learned positions (gpt2)."""

import warnings

import pytest
import torch

import cwlens
from cwlens.cli.main import main
from cwlens.datasets import TextSample
from cwlens.engine.handle import wrap
from cwlens.errors import CwlensWarning, UsageError
from cwlens.testing import save_tiny

LONG = " ".join(["the cat sat on the mat"] * 40)  # 241 tokens: the tiny models' n_ctx is 128
N = 241
COMMANDS = {
    "analyze": ["analyze", "--text", LONG, "--out", "{p}/past.html", "--window", "16"],
    "export": ["export", "--text", LONG, "--out", "{p}/past-export", "--format", "csv"],
    "faithfulness": ["faithfulness", "--dataset", "fineweb_edu", "--samples", "1", "--metrics",
                     "attention", "--rates", "0.5", "--max-tokens", "300", "--out", "{p}/past-f",
                     "--figures", "", "--no-progress"],
    "faithfulness-file": ["faithfulness", "--file", "{p}/long.txt", "--metrics", "attention",
                          "--rates", "0.5", "--max-tokens", "300", "--out", "{p}/past-ff",
                          "--figures", "", "--no-progress"],
    "sinks": ["sinks", "--dataset", "fineweb_edu", "--samples", "2", "--max-tokens", "300",
              "--scales", "0", "--out", "{p}/past-s", "--figures", "{p}/past-fig", "--no-png"],
}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    base = tmp_path_factory.mktemp("past")
    (base / "long.txt").write_text(LONG)
    rotary, learned = save_tiny("llama", base), save_tiny("gpt2", base)
    return {"base": base, "rotary": rotary, "learned": learned,
            "model": cwlens.load_model(str(rotary), device="cpu"),
            "gpt2": cwlens.load_model(str(learned), device="cpu")}


def _main(argv, ctx, which) -> int:
    argv = [a.replace("{p}", str(ctx["base"])) for a in argv] + ["--model", str(ctx[which])]
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_learned_positions_refuse_past_context_in_one_line(ctx, command, capsys, monkeypatch):
    monkeypatch.chdir(ctx["base"])
    got = _main(COMMANDS[command] + ["--past-context"], ctx, "learned")
    err = capsys.readouterr().err
    errors = [x for x in err.splitlines() if "error:" in x]
    assert got == 2, err
    assert "Traceback" not in err and len(errors) == 1, err
    assert "--past-context" in errors[0] and "learned position embeddings" in errors[0], err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_rotary_models_run_past_the_context_with_one_note(ctx, command, capsys, monkeypatch):
    monkeypatch.chdir(ctx["base"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = _main(COMMANDS[command] + ["--past-context"], ctx, "rotary")
    err = capsys.readouterr().err
    assert got == 0, err
    notes = [x for x in err.splitlines() if x.startswith("cwlens: note: ")]
    past = [x for x in notes if "--past-context" in x or "past this model's trained" in x]
    assert len(past) == 1 and "--past-context" in past[0], err  # said once, by the surface
    assert not any("using its first 128" in x or "using their first 128" in x for x in notes), err


def test_without_the_flag_the_cli_still_cuts(ctx, capsys, monkeypatch):
    monkeypatch.chdir(ctx["base"])
    assert _main(COMMANDS["export"], ctx, "rotary") == 0
    assert "using its first 128 tokens" in capsys.readouterr().err


def test_export_tables_cover_every_token_past_the_context(ctx, tmp_path):
    from cwlens.report.export import export_texts

    model = ctx["model"]
    with pytest.warns(CwlensWarning, match="241 tokens, past the model's context"):
        paths = export_texts(model, [LONG], tmp_path / "e", fmt="csv", past_context=True)
    import pandas as pd

    tokens = pd.read_csv(paths["column_sums"])
    assert tokens["key"].max() == N - 1  # every key position, past 128
    with pytest.warns(CwlensWarning, match="using its first 128"):
        cut = export_texts(model, [LONG], tmp_path / "c", fmt="csv")
    assert pd.read_csv(cut["column_sums"])["key"].max() == 127


def test_analyze_text_runs_the_whole_text_and_equals_the_plain_stream(ctx):
    from cwlens.report import analyze_text

    model = ctx["model"]
    with pytest.warns(CwlensWarning, match="past the model's context"):
        an = analyze_text(model, LONG, max_tokens=None, window=8, past_context=True)
    assert len(an.str_tokens) == N
    # the sink rate over the N - 1 queries after the sink equals the stream API's own
    tokens = model.to_tokens(LONG, truncate=False)
    with pytest.warns(CwlensWarning, match="past this model's trained context"):
        rates = cwlens.stream(model, tokens, lambda ly, w: w[0, :, 1:, 0].sum(-1), metric="attention")
    assert torch.allclose(an.sink_rate, torch.stack(rates) / (N - 1), atol=1e-5)


def test_faithfulness_and_sinks_keep_documents_past_the_context(ctx):
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
    from cwlens.sinks import run as sink_run

    model = ctx["model"]
    docs = [TextSample("long", LONG, "toy"), TextSample("short", "the cat sat .", "toy")]
    cfg = FaithfulnessConfig(metrics=("attention",), rates=(0.5,), max_tokens=200, past_context=True)
    one = ("1 of the 2 documents is longer than the model.s context .n_ctx. of 128 tokens: "
           "running it up to its first 200")
    with pytest.warns(CwlensWarning, match=one) as seen:
        table = run_faithfulness(model, docs, cfg, progress=False).table
    assert sum("past" in str(w.message) for w in seen) == 1  # not once per forward pass
    clean = table[(table["mode"] == "clean") & (table.measure == "nll")]
    assert len(clean) == 2
    plan = sink_run.batches(wrap(model), docs, 200, 8, past_context=True)
    assert max(b.tokens.shape[1] for b in plan) == 200
    assert max(b.tokens.shape[1] for b in sink_run.batches(wrap(model), docs, 200, 8)) == 128


def test_the_api_refuses_past_context_on_learned_positions(ctx):
    from cwlens.engine.batching import check_past_context
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness

    assert check_past_context(wrap(ctx["model"]).info, True) is True
    with pytest.raises(UsageError, match="learned position embeddings"):
        check_past_context(wrap(ctx["gpt2"]).info, True)
    with pytest.raises(UsageError):
        run_faithfulness(ctx["gpt2"], [TextSample("a", "the cat", "toy")],
                         FaithfulnessConfig(metrics=("attention",), past_context=True), progress=False)
    assert check_past_context(wrap(ctx["gpt2"]).info, False) is False


def test_faithfulness_scores_one_file_as_one_document(ctx, capsys, monkeypatch):
    """``cwlens faithfulness --file``: the whole file, one document (past n_ctx with the flag)."""
    import json

    monkeypatch.chdir(ctx["base"])
    argv = COMMANDS["faithfulness-file"] + ["--past-context", "--out", "{p}/one-file"]
    assert _main(argv, ctx, "rotary") == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (ctx["base"] / "one-file" / "file_long.jsonl").read_text().splitlines()]
    import hashlib

    assert {r["sample_id"] for r in rows} == {"file_long-" + hashlib.sha256(LONG.encode()).hexdigest()[:12]}
    assert {r["dataset"] for r in rows} == {"file_long"}
    clean = [r["value"] for r in rows if r["mode"] == "clean" and r["measure"] == "nll"]
    model = ctx["model"]  # the clean NLL of all 241 tokens, past the context of 128
    tokens = model.to_tokens(LONG, truncate=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CwlensWarning)
        logp = torch.log_softmax(model(tokens)[0].double(), -1)
    want = -logp[:-1].gather(-1, tokens[0, 1:, None]).mean()
    assert len(clean) == 1 and clean[0] == pytest.approx(float(want), abs=1e-4)


@pytest.mark.parametrize("past, end", [(False, "using their first 128"),
                                       (True, "running them up to their first 300")])
def test_the_cut_warning_counts_the_long_texts_in_words(ctx, past, end):
    from cwlens.engine.batching import context_cap

    with pytest.warns(CwlensWarning, match=f"2 of the 3 texts are longer .*: {end}"):
        cap = context_cap(wrap(ctx["model"]).info, 300, iter([500, 10, 129]), past_context=past)
    assert cap == (300 if past else 128)
