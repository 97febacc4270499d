"""#39.8: a summary sentence that ranks metrics ("the least sufficient label-free metric",
"every other ...") is derived from the table's Δ column, never written by hand: on
Gemma-3 capitals contribution was called the least sufficient label-free metric while
random was resolved *less* sufficient than it."""

import numpy as np
import pandas as pd

from cwlens.faithfulness import aopc as A
from cwlens.faithfulness.report import standing


def _summary(mode: str, deltas: dict[str, tuple[float, bool]]) -> pd.DataFrame:
    """An :func:`~cwlens.faithfulness.aopc.aopc_summary`-like table: ``{metric: (Δ, resolved)}``."""
    rows = [dict(metric="contribution", mode=mode, delta=float("nan"), resolved=False)]
    rows += [dict(metric=m, mode=mode, delta=d, resolved=r) for m, (d, r) in deltas.items()]
    return pd.DataFrame(rows)


# docs/accuracy_masking_gemma.md, capitals, sufficiency (paper's wording): the Δ column
GEMMA_CAPITALS = {"attention": (0.105, True), "value_weighted": (0.093, True),
                  "value_weighted_output_normalized": (0.093, True), "contribution_abs": (0.083, True),
                  "alti": (0.077, True), "alti_attention": (0.050, True),
                  "attention_gradient": (0.105, True), "attention_gradient_abs": (0.076, True),
                  "random": (-0.045, True)}


def test_random_below_contribution_means_no_least():
    text = standing(_summary("sufficiency", GEMMA_CAPITALS), "sufficiency")
    assert "least" not in text and "most" not in text
    assert text.endswith("resolved less: random; not resolved: none")
    assert "resolved more sufficient than contrib: attn, vw, vwon, abs contrib, alti, alti(attn)" in text


def test_the_least_only_when_every_label_free_metric_is_resolved_above():
    deltas = {m: v for m, v in GEMMA_CAPITALS.items() if m != "random"} | {"random": (0.2, True)}
    assert standing(_summary("sufficiency", deltas), "sufficiency").startswith(
        "sufficiency: contrib is the least sufficient label-free metric; ")
    # a supervised reference below it does not take the superlative away (it reads the label)
    deltas["attention_gradient"] = (-0.1, True)
    assert "the least sufficient label-free metric" in standing(_summary("sufficiency", deltas), "sufficiency")
    # one label-free metric not resolved does
    deltas["alti"] = (0.01, False)
    text = standing(_summary("sufficiency", deltas), "sufficiency")
    assert "least" not in text and "not resolved: alti" in text


def test_the_most_when_every_label_free_metric_is_resolved_below():
    deltas = {"attention": (-0.2, True), "value_weighted": (-0.1, True), "random": (-0.3, True),
              "attention_gradient": (0.3, True)}
    text = standing(_summary("comprehensiveness", deltas), "comprehensiveness")
    assert text == ("comprehensiveness: contrib is the most comprehensive label-free metric; "
                    "resolved more comprehensive than contrib: attn×grad (sup.); resolved less: "
                    "attn, vw, random; not resolved: none")


def _rows(scores: dict[str, float], n: int = 40, seed: int = 0) -> pd.DataFrame:
    """Per-sample accuracy rows of a sufficiency run: metric ``m`` keeps each item right with
    probability ``scores[m]`` (the clean model answers every item right)."""
    rng = np.random.default_rng(seed)
    rows = [dict(metric="none", mode="clean", rate=0.0, layers="none", sample_id=f"s{i}",
                 measure="acc", value=1.0) for i in range(n)]
    for m, p in scores.items():
        for r in (0.1, 0.3, 0.5):
            right = rng.random(n) < p
            rows += [dict(metric=m, mode="sufficiency", rate=r, layers="all", sample_id=f"s{i}",
                          measure="acc", value=float(v)) for i, v in enumerate(right)]
    return pd.DataFrame(rows)


def test_the_aopc_table_says_where_contribution_stands_from_its_own_delta_column():
    """Contribution below attention, random below contribution: the printed lines list
    them on the two sides and call nothing the least."""
    table = _rows({"attention": 0.98, "contribution": 0.55, "random": 0.05})
    per = A.aopc(A.damages(table, "acc"))
    summary = A.aopc_summary(per, n_boot=500)
    text = A.markdown(summary, "acc", A.verdicts(per, n_boot=500))
    line = next(s for s in text.splitlines() if s.startswith("- sufficiency: "))
    # a Δ outside the bootstrap-t's validity range (40 items) is named with a † (#39.7)
    assert line.replace("†", "") == ("- sufficiency: resolved more sufficient than contrib: attn; "
                                     "resolved less: random; not resolved: none")
    assert "least" not in line
    bold = {r.metric: r.delta > 0 for r in summary.itertuples() if r.resolved}
    assert bold == {"attention": True, "random": False}  # the Δ column the line reads
