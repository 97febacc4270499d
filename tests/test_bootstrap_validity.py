"""Where the bootstrap-t and Holm hold (issue 39, point 7), checked by simulation: inside
the documented validity range (:data:`cwlens.core.bootstrap.VALID_SKEWNESS`) the 95%
interval covers and Holm keeps the family-wise error; outside it (strong skew, few
samples) they do not, and the flag of the tables fires. Small: a few seconds."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cwlens.core import bootstrap_validity as bv
from cwlens.core.bootstrap import (
    FLAG,
    VALID_SKEWNESS,
    outside_validity,
    paired_bootstrap,
    sample_skewness,
    skewness_bound,
    studentized,
)

JSON = Path(__file__).resolve().parents[1] / "results" / "bootstrap_validity.json"
LOGNORMAL = next(p for p in bv.POPULATIONS if p.name == "lognormal(s=1)")  # skewness 6.18


def test_the_fast_simulation_is_the_shipped_bootstrap():
    """Two matrix products over the resample counts give studentized's intervals and
    p-values (same seed: the same resamples), and the counted decisions its coverage."""
    for n in (8, 24):
        x = LOGNORMAL.draw(np.random.default_rng(n), (300, n))
        m, low, high, p = studentized(x, 2000, seed=0)
        counts = bv.resample_counts(n, 2000, 0)
        m2, low2, high2, p2 = bv.studentized_fast(x, counts)
        np.testing.assert_allclose(np.stack([m2, low2, high2]), np.stack([m, low, high]), rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(p2, p)
        covered, p3, _ = bv.null_tests(x, counts)
        np.testing.assert_array_equal(covered, (low <= 0) & (high >= 0))
        np.testing.assert_array_equal(p3, p)


def test_sample_skewness_is_the_adjusted_fisher_pearson_coefficient():
    x = np.random.default_rng(0).lognormal(size=(5, 40))
    ref = pd.DataFrame(x.T).skew().to_numpy()  # pandas: G1
    np.testing.assert_allclose(sample_skewness(x), ref, rtol=1e-10)
    assert np.isnan(sample_skewness([2.0, 2.0, 2.0])) and np.isnan(sample_skewness([1.0, 2.0]))


def _inside(n: int) -> bv.Population:
    """The most skewed population of the grid inside the documented range at ``n``."""
    bound = skewness_bound(n)
    return max((p for p in bv.POPULATIONS if p.skewness <= bound), key=lambda p: p.skewness)


@pytest.mark.parametrize("n", [24, 100])
def test_inside_the_range_coverage_and_family_wise_error_hold(n):
    pop = _inside(n)
    r = bv.simulate(pop, n, families=100)  # 3000 null tests
    # Monte Carlo margins: 3000 intervals (s.e. 0.004), 750 families of 4 (s.e. 0.008)
    assert r.covered.mean() >= 0.93, (pop.name, r.covered.mean())
    assert bv.family_error(r.p, 4) <= 0.075, (pop.name, bv.family_error(r.p, 4))
    assert bv.family_error(r.p, 30) <= 0.12, (pop.name, bv.family_error(r.p, 30))


def test_outside_the_range_they_fail_and_the_flag_fires():
    """lognormal(0, 1) differences at n = 8: the coverage and Holm's error the issue
    found, and the flag marks most such samples (a sample's skewness understates the
    population's 6.18, so not all)."""
    r = bv.simulate(LOGNORMAL, 8, families=100)
    assert r.covered.mean() < 0.92
    assert bv.family_error(r.p, 4) > 0.1
    flagged = outside_validity(8, r.skewness)
    assert flagged.mean() > 0.9
    # one strongly skewed small sample, as a table cell sees it
    d = paired_bootstrap(np.zeros(8), [0.0, 0.1, 0.0, 0.2, 0.1, 0.0, 0.1, 3.0])
    assert d.flagged and abs(d.skewness) > 2
    # a long, mildly skewed one is not
    big = np.random.default_rng(1).gamma(16.0, size=500)
    assert not paired_bootstrap(np.zeros(500), big).flagged


def test_the_flag_rule():
    smallest = VALID_SKEWNESS[0][0]
    assert outside_validity(smallest - 1, 0.0)  # below the measured sizes
    assert not outside_validity(2, 5.0)  # no interval at all (MIN_N), nothing to flag
    assert not outside_validity(500, float("nan"))  # no spread: exact
    for n, bound in VALID_SKEWNESS:
        if bound >= 0:
            assert not outside_validity(n, bound) and not outside_validity(n + 1, -bound)
        assert outside_validity(n, bound + 0.01)
    np.testing.assert_array_equal(outside_validity(500, np.array([0.0, -9.0, np.nan])), [False, True, False])
    identical = paired_bootstrap(np.ones(5), np.ones(5))
    assert identical.identical and not identical.flagged


def test_the_rule_is_the_measured_table():
    """The constant the tables use is what scripts/bootstrap_validity.py measured."""
    data = json.loads(JSON.read_text())
    assert tuple((int(n), float(g)) for n, g in data["valid_skewness"]) == VALID_SKEWNESS
    cell = next(c for c in data["cells"] if c["population"] == "lognormal(s=1)" and c["n"] == 8)
    assert cell["coverage"] < 0.92  # the finding, reproduced by the script


def test_tables_mark_cells_outside_the_range():
    """An AOPC table whose Δ rests on skewed differences (one outlier among 200 samples)
    marks that cell with † and says what it means; a cell inside the range is unmarked."""
    from cwlens.faithfulness import aopc as A

    rng = np.random.default_rng(0)
    rows = []
    for k in range(200):
        base = rng.normal(1.0, 0.1)
        for metric, bump in (("contribution", 0.0), ("attention", 5.0 if k == 0 else 0.0),
                             ("value_weighted", rng.normal(0, 0.05))):
            for mode in ("comprehensiveness", "sufficiency"):
                a = base + bump
                rows.append(dict(metric=metric, mode=mode, sample_id=str(k), aopc=a,
                                 score=a if mode == "comprehensiveness" else -a))
    summary = A.aopc_summary(pd.DataFrame(rows), n_boot=499)
    assert summary.loc[summary.metric == "attention", "delta_flagged"].all()
    assert not summary.loc[summary.metric == "value_weighted", "delta_flagged"].any()
    text = A.markdown(summary, "delta_nll")
    att = next(line for line in text.splitlines() if line.startswith("| attn "))
    vw = next(line for line in text.splitlines() if line.startswith("| vw "))
    assert att.count(FLAG) >= 2 and FLAG not in vw.split("|")[3]
    assert "outside the validity range" in text and "statistics.md" in text
    # the summary sentence under the table names the flagged Δ with its mark too
    against = next(line for line in text.splitlines() if line.startswith("- comprehensiveness: "))
    assert f"attn{FLAG}" in against and f"vw{FLAG}" not in against
