"""AOPC: the damages are the right differences, the area is the mean over rates, the paired
differences and verdicts read the per-sample scores, and a real run's AOPC equals the
mean of its per-rate ΔNLL computed by hand."""

import numpy as np
import pandas as pd
import pytest

from cwlens.errors import InvalidArgumentError
from cwlens.faithfulness import aopc as A


def _rows(values, clean, measure="nll"):
    """A results table: ``values[(metric, mode, rate, sample)] = masked value``."""
    rows = [dict(metric="none", mode="clean", rate=0.0, layers="none", sample_id=s,
                 measure=measure, value=v) for s, v in clean.items()]
    rows += [dict(metric=m, mode=mode, rate=r, layers="all", sample_id=s, measure=measure, value=v)
             for (m, mode, r, s), v in values.items()]
    return pd.DataFrame(rows)


def test_delta_nll_is_masked_minus_clean_and_aopc_the_mean_over_rates():
    clean = {"a": 2.0, "b": 3.0}
    values = {("contribution", "comprehensiveness", r, s): clean[s] + 10 * r + (s == "b")
              for r in (0.1, 0.3) for s in "ab"}
    d = A.damages(_rows(values, clean))
    got = d.set_index(["rate", "sample_id"])["damage"]
    assert got[(0.1, "a")] == pytest.approx(1.0) and got[(0.3, "b")] == pytest.approx(4.0)
    per = A.aopc(d).set_index("sample_id")
    assert per.loc["a", "aopc"] == pytest.approx((1.0 + 3.0) / 2)
    assert per.loc["b", "aopc"] == pytest.approx((2.0 + 4.0) / 2)
    assert (per["score"] == per["aopc"]).all()  # comprehensiveness: score = +AOPC


def test_sufficiency_score_is_minus_aopc_and_accuracy_damage_is_a_drop():
    clean = {"a": 1.0}
    values = {("attention", "sufficiency", 0.5, "a"): 0.0}
    d = A.damages(_rows(values, clean, measure="acc"), "acc")
    assert d["damage"].iloc[0] == 1.0  # accuracy fell from 1 to 0
    assert A.aopc(d)["score"].iloc[0] == -1.0


def test_a_curve_missing_a_rate_is_an_error_not_a_shorter_curve():
    clean = {"a": 1.0, "b": 1.0}
    values = {("attention", "comprehensiveness", 0.1, "a"): 2.0,
              ("attention", "comprehensiveness", 0.3, "a"): 3.0,
              ("attention", "comprehensiveness", 0.1, "b"): 2.0}
    with pytest.raises(InvalidArgumentError, match="lack some of the rates"):
        A.aopc(A.damages(_rows(values, clean)))
    with pytest.raises(InvalidArgumentError, match="not a damage measure"):
        A.damages(_rows(values, clean), "nll")


def _synthetic(n=30, seed=0):
    """Four hierarchy metrics whose comprehensiveness damage grows along the paper's order,
    plus per-sample noise shared by all metrics (what the pairing removes)."""
    rng = np.random.default_rng(seed)
    clean = {f"s{i}": 2.0 for i in range(n)}
    shared = {s: rng.normal(0, 1.0) for s in clean}
    values = {}
    for k, m in enumerate(("attention", "value_weighted", "value_weighted_output_normalized",
                           "contribution")):
        for r in (0.1, 0.3):
            for s in clean:
                values[(m, "comprehensiveness", r, s)] = 2.0 + shared[s] + 0.5 * k + r + rng.normal(0, 0.05)
    return _rows(values, clean)


def test_paired_differences_and_verdict_on_a_known_order():
    per = A.aopc(A.damages(_synthetic()))
    summary = A.aopc_summary(per).set_index("metric")
    # attention is 1.5 below contribution on every sample (+ noise): paired difference -1.5
    assert summary.loc["attention", "delta"] == pytest.approx(-1.5, abs=0.05)
    assert summary.loc["attention", "delta_high"] < 0 and summary.loc["attention", "resolved"]
    assert np.isnan(summary.loc["contribution", "delta"])
    # the unpaired intervals overlap (shared noise sd 1), the paired ones do not
    assert summary.loc["attention", "ci_high"] > summary.loc["value_weighted", "ci_low"]
    verdict = A.verdicts(per)[("comprehensiveness", "signed")]
    # 30 samples: a pair whose differences' sample skewness exceeds the validity range's
    # bound at this n is named after a † (cwlens.core.bootstrap.flag_note)
    assert verdict.split(" (†")[0] == "attn < vw < vwon < contrib: holds"


def test_markdown_escapes_the_pipes_of_metric_names():
    clean = {"a": 1.0, "b": 1.5}
    values = {(m, "comprehensiveness", 0.1, s): 2.0 + i + (s == "b")
              for i, m in enumerate(("contribution", "attention_gradient_abs")) for s in clean}
    per = A.aopc(A.damages(_rows(values, clean)))
    text = A.markdown(A.aopc_summary(per), "delta_nll")
    row = next(line for line in text.splitlines() if "attn×grad" in line)
    assert row.startswith("| \\|attn×grad\\| (sup.) |")
    assert row.count(" | ") == 4  # five cells: the escaped pipes do not split the row


def test_fewer_than_three_samples_print_means_without_intervals_or_verdicts():
    """n = 2 printed "0.217 [nan, nan] | +0.000 [+nan, +nan]" and an "unresolved" hierarchy."""
    clean = {"a": 1.0, "b": 1.5}
    values = {(m, "comprehensiveness", 0.1, s): 2.0 + i + (s == "b")
              for i, m in enumerate(("contribution", "attention")) for s in clean}
    per = A.aopc(A.damages(_rows(values, clean)))
    text = A.markdown(A.aopc_summary(per), "delta_nll", A.verdicts(per))
    assert "nan" not in text and "2 samples: no interval, the bootstrap needs 3" in text
    assert "No hierarchy: its paired test needs at least 3 samples (n = 2)" in text
    assert "Hierarchy on AOPC" not in text and "**" not in text


def test_aopc_of_a_real_run_equals_the_per_rate_delta_nll_by_hand():
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
    from cwlens.testing import tiny_model

    model = tiny_model("llama")
    cfg = FaithfulnessConfig(metrics=("attention", "contribution", "random"), rates=(0.1, 0.3, 0.5),
                             max_tokens=16, batch_tokens=64)
    table = run_faithfulness(model, "fineweb_edu", cfg, n=3, progress=False).table
    per = A.aopc(A.damages(table)).set_index(["metric", "mode", "sample_id"])
    nll = table[table.measure == "nll"]
    for (metric, mode, sid), row in per.iterrows():
        clean = nll[(nll["mode"] == "clean") & (nll.sample_id == sid)]["value"].iloc[0]
        masked = nll[(nll.metric == metric) & (nll["mode"] == mode) & (nll.sample_id == sid)]
        assert sorted(masked.rate) == [0.1, 0.3, 0.5]
        assert row["aopc"] == pytest.approx(float((masked["value"] - clean).mean()), abs=1e-12)


def test_curve_figure_has_one_step_per_rate_and_one_line_per_metric():
    from cwlens.plotting.faithfulness import aopc_curves

    d = A.damages(_synthetic(n=6))
    fig = aopc_curves(A.curve_summary(d, n_boot=200), A.aopc_summary(A.aopc(d), n_boot=200),
                      "synthetic", A.UNITS["delta_nll"])
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    # equal steps (AOPC weighs each rate equally), labelled with the rates
    assert list(fig.layout.xaxis.tickvals) == [0, 1] and list(fig.layout.xaxis.ticktext) == ["0.1", "0.3"]
    assert all(list(t.x) == [0, 1] for t in lines)
    assert sorted(t.legendgroup for t in lines) == sorted(
        f"{m}1" for m in ("attention", "value_weighted", "value_weighted_output_normalized",
                          "contribution"))
    assert all("AOPC" in t.name for t in lines)


def test_cli_prints_the_aopc_table_and_draws_the_curves(tmp_path, capsys):
    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    model = save_tiny("llama", tmp_path)
    args = ["faithfulness", "--model", str(model), "--dataset", "fineweb_edu", "--samples", "2",
            "--max-tokens", "16", "--metrics", "attention,contribution", "--out", str(tmp_path / "r"),
            "--figures", str(tmp_path / "fig"), "--no-png", "--no-progress"]
    md2, md3 = tmp_path / "two.md", tmp_path / "three.md"
    assert main([*args, "--rates", "0.1,0.5", "--summary-md", str(md2)]) == 0  # two rates: no AOPC
    assert "area over the perturbation curve" not in capsys.readouterr().out
    assert "faithfulness-aopc" not in md2.read_text()
    assert main([*args, "--rates", "0.1,0.3,0.5", "--out", str(tmp_path / "r3"),
                 "--summary-md", str(md3)]) == 0
    out = capsys.readouterr().out
    assert "area over the perturbation curve" in out and "| contrib |" in out
    assert (tmp_path / "fig" / "faithfulness_fineweb_edu_aopc.html").exists()
    # --summary-md holds the printed AOPC tables too, in a block of their own
    page = md3.read_text()
    block = page[page.index("<!-- faithfulness-aopc:start -->"):page.index("<!-- faithfulness-aopc:end -->")]
    assert "| contrib |" in block and block.split("\n", 1)[1].strip() in out
    # the same page under a two-rate run: its old AOPC block is cleared, not left stale
    assert main([*args, "--rates", "0.1,0.5", "--summary-md", str(md3), "--report-only"]) == 0
    page = md3.read_text()
    assert "| contrib |" not in page.split("<!-- faithfulness-aopc:start -->")[1]
    assert "fewer than three masking rates" in page


def test_per_layer_figure_refuses_rows_masked_in_every_layer_at_once():
    from cwlens.plotting.faithfulness import per_layer_curves

    with pytest.raises(InvalidArgumentError, match="per-layer run"):
        per_layer_curves(A.damages(_synthetic(n=3)))  # layers = "all"


def test_numbers_print_round_off_as_zero_and_keep_small_values_visible():
    assert A._num(-1.11e-18) == "0.000"  # a mean of exact zeros, read back with round-off
    assert A._num(-1.11e-18, "+") == "+0.000"
    assert A._num(0.00296, "+") == "+0.00296"
    assert A._num(0.5) == "0.500"


def test_replicate_claims_print_no_nan_interval_below_three_samples():
    from types import SimpleNamespace

    from cwlens.replication.claims import _delta

    clean = {"a": 1.0, "b": 1.5}
    values = {(m, "comprehensiveness", 0.1, s): 2.0 + i + (s == "b")
              for i, m in enumerate(("contribution", "attention")) for s in clean}
    view = SimpleNamespace(aopc=A.aopc_summary(A.aopc(A.damages(_rows(values, clean)))))
    res = SimpleNamespace(views={("removed", True): view}, aopc=view.aopc, encoder=False)
    text = _delta(res, "attention")
    assert "nan" not in text and "n = 2: no interval" in text and "unresolved" not in text
