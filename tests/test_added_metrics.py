"""Adding metrics to a finished faithfulness run computes only the added metrics, and the
table equals one run with every metric (:mod:`cwlens.faithfulness.added_metrics`)."""

import json

import pandas as pd
import pytest

from cwlens.faithfulness import FaithfulnessConfig, read_results, run_faithfulness
from cwlens.faithfulness.results import ConfigMismatchError
from cwlens.runs.results_io import complete_lines

BASE = dict(rates=(0.3,), max_tokens=16, batch_tokens=32)
OLD, NEW = ("attention", "random"), ("attention", "random", "contribution", "alti")


@pytest.fixture(scope="module")
def model():
    from cwlens.testing import tiny_model

    return tiny_model("llama", "bridge")


def sweep(model, out, metrics, n=6, **kw):
    return run_faithfulness(model, "gsm8k", FaithfulnessConfig(metrics=metrics, **BASE), n=n,
                            out=out, progress=False, model_name="tiny", **kw)


def sorted_table(path):
    t = read_results(path)
    return t.sort_values(list(t.columns[:-1])).reset_index(drop=True)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_added_metrics_alone_are_computed_and_the_table_is_one_runs(model, tmp_path, suffix):
    out = tmp_path / "add" / f"gsm8k{suffix}"
    first = sweep(model, out, OLD)
    added = sweep(model, out, NEW)
    full = sweep(model, tmp_path / "full" / "gsm8k.jsonl", NEW)
    # per batch: the clean pass + comp and suff per metric (2 old + 2 added = 4 metrics)
    assert first.stats.n_forwards + added.stats.n_forwards == full.stats.n_forwards + first.stats.n_batches
    pd.testing.assert_frame_equal(sorted_table(out), sorted_table(full.path), check_exact=True)
    stored = json.loads((out.parent / "gsm8k.config.json").read_text())
    assert stored["metrics"] == list(NEW)
    again = sweep(model, out, NEW)  # everything done: nothing is computed
    assert again.stats.n_forwards == 0


def test_an_addition_cut_by_a_kill_resumes_the_addition(model, tmp_path):
    out = tmp_path / "gsm8k.jsonl"
    sweep(model, out, OLD)
    sweep(model, out, NEW)
    lines = complete_lines(out)
    ids = list(dict.fromkeys(json.loads(x)["sample_id"] for x in lines))
    # as if killed before the last two samples' added rows were written
    out.write_text("".join(x + "\n" for x in lines
                           if not (json.loads(x)["sample_id"] in ids[-2:]
                                   and json.loads(x)["metric"] in ("contribution", "alti"))))
    resumed = sweep(model, out, NEW)
    assert 0 < resumed.stats.n_forwards
    full = sweep(model, tmp_path / "full" / "gsm8k.jsonl", NEW)
    pd.testing.assert_frame_equal(sorted_table(out), sorted_table(full.path), check_exact=True)


def test_adding_to_an_unfinished_run_or_changing_more_than_metrics_is_refused(model, tmp_path):
    out = tmp_path / "gsm8k.jsonl"
    sweep(model, out, OLD, n=4)
    lines = complete_lines(out)
    first = json.loads(lines[0])["sample_id"]
    out.write_text("".join(x + "\n" for x in lines if json.loads(x)["sample_id"] != first))
    with pytest.raises(ConfigMismatchError, match="Finish the earlier run first"):
        sweep(model, out, NEW, n=4)
    sweep(model, out, OLD, n=4)  # finished now
    with pytest.raises(ConfigMismatchError, match="differs in metrics, rates"):
        run_faithfulness(model, "gsm8k", FaithfulnessConfig(metrics=NEW, **{**BASE, "rates": (0.5,)}),
                         n=4, out=out, progress=False, model_name="tiny")
    with pytest.raises(ConfigMismatchError, match="differs in metrics"):  # removing is not adding
        sweep(model, out, OLD[:1], n=4)
