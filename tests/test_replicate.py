"""``cwlens replicate`` on a tiny decoder and a tiny encoder: every stage writes its files,
the table has a row per claim and says n/a where a claim cannot apply, a rerun computes
nothing, and the table is rebuilt from the files alone."""

import json

import pytest

from cwlens.cli.main import main
from cwlens.replication import claims, plan
from cwlens.testing import save_tiny

SIZES = ["--samples", "3", "--sentences", "6", "--sink-samples", "3", "--per-layer-samples", "2",
         "--max-tokens", "24", "--rates", "0.1,0.3,0.5", "--no-progress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replicate")
    lm, enc = str(save_tiny("llama", tmp)), str(save_tiny("bert", tmp))
    args = ["replicate", "--models", f"{lm},{enc}", "--per-layer-model", lm, "--out",
            str(tmp / "out"), "--figures", str(tmp / "fig"), "--no-png", *SIZES]
    assert main(args) == 0
    return tmp, lm, enc, args


def test_every_stage_wrote_its_files(run):
    tmp, lm, enc, _ = run
    dec, encd = plan.model_dir(tmp / "out", lm), plan.model_dir(tmp / "out", enc)
    for path in (plan.FAITHFULNESS, plan.PER_LAYER, plan.SINKS + "/summary.json", plan.TOKEN_CLASSES):
        assert (dec / path).exists(), path
    for path in (plan.ENCODER_FAITHFULNESS, plan.SINKS + "/summary.json", plan.TOKEN_CLASSES):
        assert (encd / path).exists(), path
    assert not (encd / plan.FAITHFULNESS).exists() and not (encd / plan.PER_LAYER).exists()
    assert "ppl" not in json.loads((encd / plan.SINKS / "summary.json").read_text())  # no intervention
    figs = sorted(p.name for p in (tmp / "fig").iterdir())
    assert figs == sorted([f"replicate_aopc_{plan.model_dir('', m).name}.html" for m in (lm, enc)]
                          + [f"replicate_per_layer_{plan.model_dir('', lm).name}.html"])


def test_table_has_every_claim_and_honest_na(run):
    tmp, lm, enc, _ = run
    results = [claims.load(tmp / "out", lm), claims.load(tmp / "out", enc)]
    table = claims.claims_table(results)
    rows = [line for line in table.splitlines()[2:] if line.startswith("| ")]
    assert len(rows) == len(claims.CLAIMS)
    cells = {claim: line for (claim, _, _), line in zip(claims.CLAIMS, rows, strict=True)}
    decoder_cells = [c(results[0]) for _, _, c in claims.CLAIMS]
    # the decoder ran everything: no n/a at all
    assert not [c for c in decoder_cells if c.startswith("n/a") and "none in the texts" not in c]
    grad = cells["attention × gradient (supervised) vs signed c"]
    assert grad.rstrip(" |").endswith("n/a (needs a next-token loss)")
    assert cells["Sink-norm intervention vs control"].rstrip(" |").endswith("n/a (needs a next-token loss)")
    assert "holds" in table or "does not hold" in table or "unresolved" in table
    assert results[0].per_layer is not None and set(results[0].per_layer["layers"]) == {"0", "1"}
    # every Δ against contribution carries a verdict; an unresolved one is not called a tie
    alti = claims._delta(results[0], "alti")
    words = [w.split(")")[0] for w in alti.split("(")[1:]]
    assert len(words) == 2 and set(words) <= {"better", "worse", "unresolved"}, alti
    assert "(tie)" not in table and "(unresolved)" in table  # this tiny run has some (n = 2)


def test_rerun_computes_nothing_and_table_only_rebuilds(run, capsys, tmp_path):
    tmp, lm, enc, args = run
    files = [plan.model_dir(tmp / "out", lm) / plan.FAITHFULNESS,
             plan.model_dir(tmp / "out", enc) / plan.ENCODER_FAITHFULNESS]
    before = [p.read_bytes() for p in files]
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "faithfulness: 0 batches computed now" in out
    assert [p.read_bytes() for p in files] == before
    docs = tmp_path / "claims.md"
    table_only = ["replicate", "--models", f"{lm},{enc}", "--per-layer-model", lm, "--out",
                  str(tmp / "out"), "--figures", "", "--table-only", "--docs", str(docs), *SIZES]
    for _ in range(2):  # the block is replaced, not appended
        assert main(table_only) == 0
    text = docs.read_text()
    assert text.count(claims.START) == 1 and "| Hierarchy, comprehensiveness, signed c |" in text
    assert "note" not in capsys.readouterr().err
    # other sizes than the stored run's were ignored without a word; a trailing slash on
    # --per-layer-model was "not one of --models"
    other = [*table_only[:table_only.index("--samples")], "--samples", "5", "--rates", "0.2,0.4",
             "--no-progress"]
    other[other.index("--per-layer-model") + 1] = lm + "/"
    assert main(other) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "--samples 3 (asked: 5)" in err and "--rates 0.1,0.3,0.5 (asked: 0.2,0.4)" in err


def test_table_only_on_an_empty_folder_is_refused(tmp_path, capsys):
    # issue 19: a table of "n/a" from a folder with no results is refused (it was exit 0)
    assert main(["replicate", "--models", "smollm2-135m", "--out", str(tmp_path), "--figures", "",
                 "--table-only"]) == 1
    err = capsys.readouterr().err
    assert "--table-only" in err and "holds no results for smollm2-135m" in err


def test_a_model_that_cannot_load_is_skipped_and_named(tmp_path, capsys):
    code = main(["replicate", "--models", "no-such-model-xyz", "--out", str(tmp_path),
                 "--figures", ""])
    err = capsys.readouterr().err
    assert code == 1 and "no model could be loaded" in err and "no-such-model-xyz" in err


@pytest.mark.parametrize("bad", ["--models a,a", "--models ,", "--rates 0.1,2", "--samples 0",
                                 "--max-tokens -1", "--sentences x"])
def test_bad_options_are_usage_errors(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["replicate", *bad.split()])
    assert exc.value.code == 2


def test_per_layer_model_must_be_one_of_the_models(tmp_path, capsys):
    code = main(["replicate", "--models", "smollm2-135m", "--per-layer-model", "gemma-3-270m",
                 "--out", str(tmp_path), "--figures", "", "--table-only"])
    assert code == 1 and "--per-layer-model 'gemma-3-270m' is not one of --models" in capsys.readouterr().err


def test_batch_tokens_keep_one_batch_of_logits_within_budget():
    from types import SimpleNamespace

    from cwlens.engine.handle import wrap
    from cwlens.replication.plan import ReplicationConfig
    from cwlens.replication.stages import LOGIT_BUDGET, batch_tokens

    cfg = ReplicationConfig()
    shape = dict(n_layers=1, n_heads=1, d_model=1, d_head=1)  # what cwlens.wrap asks of a model
    sizes = {v: batch_tokens(wrap(SimpleNamespace(cfg=SimpleNamespace(d_vocab=v, **shape),
                                                  run_with_hooks=print, hooks=print)), cfg)
             for v in (49152, 262144, 10**7)}
    assert sizes[49152] == cfg.batch_tokens  # SmolLM2: unchanged
    assert sizes[262144] == 512 and sizes[262144] * 262144 <= LOGIT_BUDGET  # Gemma-3
    assert sizes[10**7] == cfg.max_tokens  # never below one document


def test_first_token_view_runs_its_own_metrics(run):
    """The second view (first token never masked) holds the label-free metrics of
    ``first_token_metrics`` only; the main view holds every metric."""
    import pandas as pd

    tmp, lm, enc, _ = run
    for model, main_path in ((lm, plan.FAITHFULNESS), (enc, plan.ENCODER_FAITHFULNESS)):
        folder = plan.model_dir(tmp / "out", model)
        main_metrics = set(pd.read_json(folder / main_path, lines=True)["metric"]) - {"none"}
        view = set(pd.read_json(folder / plan.first_token_kept(main_path), lines=True)["metric"]) - {"none"}
        assert view == main_metrics & set(plan.FIRST_TOKEN_METRICS), (model, view)
        assert view < main_metrics or model == enc  # the decoder's view drops the gradient ones
    assert "attention_gradient" not in view


def test_table_only_names_a_damaged_stored_table(run, capsys, tmp_path):
    import shutil

    tmp, lm, enc, _ = run
    out = tmp_path / "copy"
    shutil.copytree(tmp / "out", out)
    (plan.model_dir(out, lm) / plan.SINKS / "summary.json").write_text("")
    assert main(["replicate", "--models", lm, "--per-layer-model", lm, "--out", str(out),
                 "--figures", "", "--table-only", *SIZES]) == 1
    err = capsys.readouterr().err
    assert "cannot be read (SinkResultsError" in err and "JSONDecodeError" in err
    assert "without --table-only" in err
    assert "Traceback" not in err

