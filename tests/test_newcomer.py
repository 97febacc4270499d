"""What a new user tripped on (issue 48, section 3): one test per point where one can be
written, each failing on the code before its fix (605cdc9)."""

import numpy as np
import pandas as pd
import pytest

# --- 5. a perplexity interval below zero; the hierarchy naming a pair twice -------------

FOUR_PPLS = (6.1, 7.4, 9.0, 64.0)  # four texts, one far off: skewed, as a real 4-text run


def _clean_rows(values, measure="ppl"):
    return pd.DataFrame([{"model": "m", "dataset": "toy", "metric": "none", "mode": "clean",
                          "rate": 0.0, "layers": "none", "scope": "row", "sample_id": f"s{i}",
                          "measure": measure, "value": float(v)} for i, v in enumerate(values)])


def test_the_interval_of_a_perplexity_stays_above_zero():
    """A 4-text run printed ``clean ppl: 21.56 [-302.43, 345.56]``: the plain bootstrap-t
    of a few skewed perplexities reaches below zero; on the log scale it cannot."""
    from cwlens.core.bootstrap import bootstrap_ci, positive_ci
    from cwlens.faithfulness.results import summarize

    low, _ = bootstrap_ci(FOUR_PPLS)
    assert low < 0  # the plain interval: what was printed
    row = summarize(_clean_rows(FOUR_PPLS)).iloc[0]
    assert 0 < row["ci_low"] <= row["mean"] <= row["ci_high"]
    assert (row["ci_low"], row["ci_high"]) == positive_ci(FOUR_PPLS)
    # nll is positive too; a signed measure keeps the plain interval
    assert summarize(_clean_rows(np.log(FOUR_PPLS), "nll")).iloc[0]["ci_low"] > 0
    delta = summarize(_clean_rows(np.array(FOUR_PPLS) - 10, "delta_ppl")).iloc[0]
    assert (delta["ci_low"], delta["ci_high"]) == pytest.approx(bootstrap_ci(np.array(FOUR_PPLS) - 10))


def test_positive_interval_edge_cases():
    from cwlens.core.bootstrap import positive_ci

    assert positive_ci([3.0, 3.0, 3.0]) == (3.0, 3.0)
    assert all(np.isnan(positive_ci([1.0, 2.0])))
    # on well-behaved data it is close to the plain interval
    from cwlens.core.bootstrap import bootstrap_ci

    x = np.random.default_rng(0).normal(50, 2, 200)
    assert positive_ci(x) == pytest.approx(bootstrap_ci(x), rel=1e-3)


def test_a_flagged_unresolved_pair_is_named_once():
    """Four samples, two metrics: the hierarchy line read ``attn ≈ contrib: unresolved
    (attn vs contrib) († attn vs contrib)``."""
    from cwlens.faithfulness.report import hierarchy_verdict

    rng = np.random.default_rng(1)
    rows = [{"dataset": "toy", "metric": metric, "mode": "comprehensiveness", "rate": 0.3,
             "scope": "row", "layers": "all", "sample_id": f"s{i}", "measure": "delta_ppl",
             "value": float(v)}
            for metric in ("attention", "contribution") for i, v in enumerate(rng.normal(10, 5, 4))]
    verdict = hierarchy_verdict(pd.DataFrame(rows), "toy", "comprehensiveness", 0.3, "delta_ppl")
    assert verdict.count("attn vs contrib") == 1, verdict
    assert verdict.endswith("unresolved (attn vs contrib†)"), verdict


# --- 1. "per head" means two things -------------------------------------------------------

TEXT = "when mary and john went to the store , john gave a bottle of milk to mary ."


@pytest.fixture(scope="module")
def tiny():
    from cwlens.testing import tiny_model

    return tiny_model("llama")


def test_the_per_head_view_compares_like_with_like(tiny, tmp_path):
    """The report's per-head heatmaps set each head's *intra* contribution (rows sum to 1,
    as attention) beside its attention unless inter is asked, and the title names the kind."""
    import torch

    from cwlens.report import analyze_text, render_report

    a = analyze_text(tiny, TEXT, window=None)
    assert a.head_kind == "intra"
    rows = a.head_view()["contribution"].sum(-1)  # [layer, head, query]
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-4)
    page = render_report(a, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "contribution to the head's own output (intra-head" in page
    inter = analyze_text(tiny, TEXT, window=None, head_kind="inter")
    assert torch.equal(inter.head_view()["contribution"], inter.contribution)
    assert "(inter-head: a head's row sums to its share" in render_report(
        inter, tmp_path / "i.html").read_text(encoding="utf-8")


def test_circuitsvis_and_heatmap_titles_name_the_kind(tiny):
    import cwlens
    from cwlens.plotting import attention_vs_contribution
    from cwlens.report.export import circuitsvis_heads, weights_kind

    _, cache = cwlens.run_with_cache(tiny, TEXT)
    inter = cwlens.contribution_weights(cache, tiny, 0)[0]
    intra = cwlens.contribution_weights(cache, tiny, 0, kind="intra")[0]
    assert (weights_kind(inter), weights_kind(intra)) == ("inter", "intra")
    assert weights_kind(cwlens.importance(cache, tiny, 0, "attention")[0] * 0.5) == "other"
    tokens = [str(t) for t in tiny.to_str_tokens(TEXT)]
    assert "inter-head" in circuitsvis_heads(inter, tokens).title
    assert "intra-head" in circuitsvis_heads(intra, tokens).title
    heads = [dict(name="L0H1", attention=intra[1].numpy(), contribution=intra[1].numpy())]
    fig = attention_vs_contribution(heads, tokens)
    assert "L0H1: contribution (intra-head)" in [a.text for a in fig.layout.annotations]


def test_the_quickstart_says_what_sums_to_one():
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if "c = cwlens.contribution_weights(cache" in x)
    assert "heads x keys sum to 1" in line
    assert 'kind="intra"' in readme.split("## Quickstart")[1].split("```")[1]


# --- 3. library use is quiet ----------------------------------------------------------------


def test_load_model_is_quiet_unless_asked(tmp_path, capfd):
    """Every load printed transformers' "Loading weights 0/272" bar."""
    import cwlens
    from cwlens.testing import save_tiny

    path = save_tiny("llama", tmp_path)
    capfd.readouterr()
    cwlens.load_model(str(path), device="cpu")
    out, err = capfd.readouterr()
    assert "Loading weights" not in out + err and (out + err).strip() == ""
    cwlens.load_model(str(path), device="cpu", verbose=True)
    assert "Loading weights" in "".join(capfd.readouterr())
    with pytest.raises(cwlens.errors.UnknownOptionError, match="verbose"):
        cwlens.load_model(str(path), device="cpu", verbos=True)
    # transformers' own settings are put back
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()


# --- 9. one rule for cwlens' environment variables ------------------------------------------


@pytest.mark.parametrize("name", ["CWLENS_PROGRESS", "CWLENS_NATIVE"])
def test_a_switch_set_to_another_word_is_refused_naming_the_words(monkeypatch, name):
    """``CWLENS_PROGRESS=sometimes`` was silently ignored where ``CWLENS_NATIVE=maybe``
    was refused."""
    from cwlens.core import env
    from cwlens.errors import InvalidArgumentError
    from cwlens.runs import progress

    monkeypatch.setenv(name, "sometimes")
    with pytest.raises(InvalidArgumentError, match=f"{name}='sometimes'.*0 \\(or false, no, off\\) or 1"):
        env.flag(name)
    if name == "CWLENS_PROGRESS":
        with pytest.raises(InvalidArgumentError, match="CWLENS_PROGRESS='sometimes'"):
            progress.shown()
    for word, value in (("ON", True), (" no ", False), ("", None)):
        monkeypatch.setenv(name, word)
        assert env.flag(name) is value


def test_the_command_refuses_a_bad_setting_before_it_runs(monkeypatch, capsys):
    from cwlens.cli.main import main

    monkeypatch.setenv("CWLENS_PROGRESS", "sometimes")
    assert main(["analyze", "--text", "hi", "--model", "no-such-model"]) == 1
    err = capsys.readouterr().err
    assert "CWLENS_PROGRESS='sometimes' is not a setting" in err and "no-such-model" not in err


def test_numbers_follow_the_same_rule(monkeypatch):
    from cwlens.core import env
    from cwlens.errors import InvalidArgumentError

    monkeypatch.setenv("CWLENS_TEST_WRITE_DELAY", "soon")
    with pytest.raises(InvalidArgumentError, match="CWLENS_TEST_WRITE_DELAY='soon' is not a number at least 0"):
        env.number("CWLENS_TEST_WRITE_DELAY", 0.0, inclusive=True)
    with pytest.raises(KeyError):  # a name cwlens does not read is a bug, not an unset variable
        env.flag("CWLENS_PROGRES")


# --- 4. short reprs -----------------------------------------------------------------------


def test_reprs_say_what_and_how_big_not_the_data(tiny):
    import cwlens
    from cwlens import reducers

    _, cache = cwlens.run_with_cache(tiny, TEXT, closure=True)
    for obj, must in ((cwlens.decompose(cache, tiny, 1), "Decomposition(kind='inter', layer 1, [batch 1"),
                      (cwlens.closure(cache, tiny), "Closure(layers 0..1: heads x keys rebuild"),
                      (cwlens.names_filter(tiny), "names_filter(6 hooks: blocks.0.attn.hook_pattern"),
                      (cwlens.stream_reduce(tiny, TEXT, [reducers.TopK(3)])["top3_contribution"],
                       "TopKResult(the 3 largest")):
        text = repr(obj)
        assert text.startswith(must), text
        assert "tensor(" not in text and "built-in method" not in text and len(text) < 300, text
    keep = cwlens.names_filter(tiny)
    assert keep("blocks.0.attn.hook_v") and not keep("blocks.0.hook_mlp_out")


# --- 9. one ranking rule for exports and reducers; groundtruth.written; random_model -------


def test_the_export_top_k_is_the_k_largest_values(tiny, tmp_path):
    """``cwlens export --metrics contribution --k 3`` listed keys by |c| (+0.093, +0.048,
    -0.039) and left out key 0 at +0.032, under a ``metric`` column saying contribution."""
    import cwlens
    from cwlens import reducers
    from cwlens.report.export import export_texts, read_tables, reduction_tables

    export_texts(tiny, [TEXT], tmp_path, k=3, metrics=("contribution",))
    top = read_tables(tmp_path)["topk"]
    assert set(top.metric) == {"contribution"}
    _, cache = cwlens.run_with_cache(tiny, TEXT)
    c = cwlens.contribution_weights(cache, tiny)[:, 0]  # [layer, head, query, key]
    for (layer, head, query), rows in top.groupby(["layer", "head", "query"]):
        want = c[layer, head, query, : query + 1].topk(min(3, query + 1)).values
        assert rows.sort_values("rank").value.to_numpy() == pytest.approx(want.numpy(), abs=1e-6)
    # a magnitude ranking of one's own says so, in its repr and its table
    res = cwlens.stream_reduce(tiny, TEXT, [reducers.TopK(3, by_abs=True)])["top3_contribution"]
    assert res.ranked_by == "|contribution|" and "largest |contribution|" in repr(res)
    table = reduction_tables(cwlens.stream_reduce(tiny, TEXT, [reducers.TopK(3, by_abs=True)]),
                             [str(t) for t in tiny.to_str_tokens(TEXT)])["topk"]
    assert set(table.metric) == {"contribution (ranked by |value|)"}


def test_every_ground_truth_call_of_the_api_table_imports_from_the_package():
    """``groundtruth.written`` was in docs/api.md's table but only importable from ``.codec``."""
    from pathlib import Path

    import cwlens.groundtruth as gt

    page = (Path(__file__).parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    names = [line.rsplit(".", 1)[1] for line in page.splitlines()
             if line.startswith("::: cwlens.groundtruth.")]
    assert "written" in names
    assert [n for n in names if not hasattr(gt, n)] == []
    assert "written" in gt.__all__


def test_random_model_leaves_nothing_in_the_temp_dir(tmp_path, monkeypatch):
    """Every call left a ``cwlens-random-*`` folder behind."""
    import tempfile

    import cwlens
    from cwlens.engine.models.random_init import random_model

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = random_model("tiny-llama")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("cwlens-random")] == []
    logits, _ = cwlens.run_with_cache(model, "t3 t4 t5")  # the model works without its folder
    assert logits.shape == (1, 4, 64)


# --- 8. MissingHookError names the hooks the call needs -------------------------------------


def test_a_missing_hook_error_names_what_the_call_needs(tiny):
    """A cache of layer 0 asked for every layer named layer 1's hooks plus a
    hook_resid_pre the call does not read; closure() on a cache without its target
    advised run_with_cache without closure=True."""
    import cwlens
    from cwlens.errors import MissingHookError

    _, cache = cwlens.run_with_cache(tiny, TEXT, layers=[0])
    with pytest.raises(MissingHookError) as err:
        cwlens.contribution_weights(cache, tiny)
    text = str(err.value)
    assert "the cache lacks 2: 'blocks.1.attn.hook_pattern', 'blocks.1.attn.hook_v'." in text
    assert "resid_pre" not in text
    with pytest.raises(MissingHookError, match=r"closure reads .*lacks 1: 'blocks\.0\.attn\..*"
                       r"cwlens\.run_with_cache\(model, tokens, layers=\[0\], closure=True\)"):
        cwlens.closure(cache, tiny, layer=0)
    _, bare = tiny.run_with_cache(TEXT, names_filter=lambda n: n.endswith(("hook_pattern", "attn.hook_v")))
    assert cwlens.contribution_weights(bare, tiny, layer=1).shape[1] == 4  # enough for it
    with pytest.raises(MissingHookError, match=r"importance\(metric='alti'\) .*lacks 1: 'blocks\.1\.hook_resid_pre'"):
        cwlens.importance(bare, tiny, 1, "alti")


# --- 2. `make demo` installs no system package --------------------------------------------


@pytest.mark.parametrize("flags, installs", [("", False), ("browser=1", True)])
def test_setup_installs_chromium_only_when_asked(tmp_path, flags, installs):
    """``make demo`` ran ``apt-get install chromium`` as root; only ``--browser`` (``make
    test``) may. The setup's function runs here with a fake root ``id`` and ``apt-get``."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).parents[1]
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "apt.log"
    for name, body in (("id", "echo 0"), ("apt-get", f'echo "$@" >> {log}')):
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    script = (root / "scripts" / "setup.sh").read_text()
    function = script[script.index("chromium_for_png() {"):]
    function = function[: function.index("\n}\n") + 3]
    subprocess.run(["/bin/bash", "-c", f"browser=0; {flags}\n{function}\nchromium_for_png"],
                   env={"PATH": str(fake)}, check=True, capture_output=True)
    assert log.exists() == installs
    make = (root / "Makefile").read_text()
    demo = make.split("\ndemo:")[1].split("\n\n")[0]
    test = make.split("\ntest:")[1].split("\n\n")[0]
    assert "--browser" not in demo and "--browser" in test


def test_a_figure_without_a_browser_is_html_and_one_note(tmp_path, monkeypatch):
    import plotly.graph_objects as go

    from cwlens.errors import CwlensWarning
    from cwlens.plotting import export

    monkeypatch.setattr(export, "find_chrome", lambda: None)
    with pytest.warns(CwlensWarning, match=r"no Chromium, so .*f\.png was skipped .*plotly_get_chrome"):
        written = export.save_figure(go.Figure(), tmp_path / "f")
    assert [p.name for p in written] == ["f.html"]


# --- 6. the README's example and excerpt ----------------------------------------------------


def test_the_readme_examples_write_under_runs():
    """``cwlens analyze --text … --out report.html`` wrote into the repository root."""
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    outs = re.findall(r"^cwlens .*--out (\S+)", readme, re.M)
    assert outs and all(o.startswith("runs/") for o in outs), outs


@pytest.mark.slow
def test_the_readme_demo_excerpt_is_a_real_run(smollm2, tmp_path, capsys):
    """The excerpt listed L18H7 first while the run listed L17H4: it is printed from a run
    (scripts/demo_excerpt.py) and must equal what the demo prints now."""
    from pathlib import Path

    from cwlens.report.demo import EXCERPT_END, EXCERPT_START, readme_excerpt, run_demo

    run_demo(model=smollm2, out_dir=tmp_path, png=False)
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split(EXCERPT_START + "\n")[1].split("\n" + EXCERPT_END)[0]
    now = readme_excerpt(capsys.readouterr().out)
    assert _rounding(block) == _rounding(now), "paste what python scripts/demo_excerpt.py prints"


def _rounding(text: str) -> str:
    """``text`` with the identity checks' float32 rounding errors ("within 4.8e-07") as
    "within ε": they differ between CPUs (the order of a float sum; 3.8e-07 on one, 4.8e-07
    on another), and each must be below 1e-5 in both the excerpt and the run."""
    import re

    errors = re.findall(r"within (\d\.\de-\d\d)", text)
    assert errors and all(float(e) < 1e-5 for e in errors), errors
    return re.sub(r"within \d\.\de-\d\d", "within ε", text)
