"""The position curves of the long-context study (:mod:`cwlens.sinks.by_position`) equal
plain loops over the queries: layer thirds, log-spaced bins, means and quantiles, with
left padding shifting positions."""

import numpy as np
import pytest
import torch

from cwlens.engine.reducers import KeySetResult
from cwlens.errors import CwlensError
from cwlens.sinks.by_position import (
    binned,
    layer_groups,
    log_bins,
    per_layer_means,
    position_curves,
    range_means,
)


def test_layer_groups_are_thirds():
    assert layer_groups(30) == {"early": list(range(10)), "middle": list(range(10, 20)),
                                "late": list(range(20, 30))}
    assert layer_groups(4) == {"early": [0, 1], "middle": [2], "late": [3]}
    assert layer_groups(2) == {"early": [0], "middle": [1]}


@pytest.mark.parametrize("n, per_octave", [(1, 4), (10, 1), (2048, 4), (100, 3)])
def test_log_bins_cover_every_position_once(n, per_octave):
    edges = log_bins(n, per_octave)
    assert edges[0] == 1 and edges[-1] == n + 1 and all(a < b for a, b in zip(edges, edges[1:], strict=False))
    if n >= 1024:  # a whole octave of wide bins: per_octave edges in it
        assert len([e for e in edges if 512 <= e < 1024]) == per_octave
    assert log_bins(10, 1) == [1, 2, 4, 8, 11]
    assert log_bins(8, 1) == [1, 2, 4, 9]  # [8, 9) alone would be half as wide as [4, 8)
    last = log_bins(2048, 4)[-3:]
    assert last == [1448, 1722, 2049]  # 2048 would start a bin of one position


@pytest.mark.parametrize("bad", [0, -3, True])
def test_bad_bin_arguments_are_refused(bad):
    with pytest.raises(CwlensError, match="positive int"):
        log_bins(bad)  # type: ignore[arg-type]
    with pytest.raises(CwlensError, match="positive int"):
        log_bins(10, bad)  # type: ignore[arg-type]


def test_binned_equals_a_loop():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(300, generator=gen)
    positions = torch.randperm(300, generator=gen) + 1
    edges = log_bins(300, 2)
    rows = binned(values, positions, edges, (0.25, 0.75))
    assert sum(r["n_queries"] for r in rows) == 300
    for r in rows:
        inside = [(float(v), int(p)) for v, p in zip(values, positions, strict=True) if r["bin_lo"] <= p <= r["bin_hi"]]
        x = np.array([v for v, _ in inside])
        assert r["n_queries"] == len(inside)
        assert r["mean"] == pytest.approx(x.mean(), abs=1e-12)
        assert r["position"] == pytest.approx(np.mean([p for _, p in inside]))
        assert r["low"] == pytest.approx(np.quantile(x, 0.25)) and r["high"] == pytest.approx(np.quantile(x, 0.75))
    with pytest.raises(CwlensError, match="quantiles"):
        binned(values, positions, edges, (0.9, 0.1))


def synthetic(kind="inter"):
    gen = torch.Generator().manual_seed(1)
    L, b, h, q = 5, 2, 3, 12
    w = {"attention": torch.rand(L, b, h, q, generator=gen),
         "contribution": torch.randn(L, b, h, q, generator=gen)}
    mask = torch.ones(b, q, dtype=torch.bool)
    mask[1, :4] = False  # left padding: row 1 starts at index 4
    for t in w.values():
        t[:, 1, :, :4] = 0
    return KeySetResult(w, mask, tuple(range(L)), (0, 1), kind)


def test_position_curves_equal_a_loop_over_queries():
    res = synthetic()
    table = position_curves({"first two": res}, n_layers=5, per_octave=1, quantiles=(0.0, 1.0))
    groups = layer_groups(5)  # early 0-1, middle 2-3, late 4
    assert set(table.group) == set(groups) and set(table.metric) == {"attention", "contribution"}
    assert set(table["keys"]) == {"0 1"} and set(table.layers) == {"0-1", "2-3", "4"}
    for metric, combine in (("attention", lambda t: t.mean(2)), ("contribution", lambda t: t.sum(2))):
        tok = combine(res.weights[metric]).double()  # [L, b, q]
        for group, layers in groups.items():
            got = table[(table.metric == metric) & (table.group == group)]
            for row in got.itertuples():
                vals = []
                for b, start in ((0, 0), (1, 4)):
                    for i in range(start, 12):
                        if row.bin_lo <= i - start + 1 <= row.bin_hi:
                            vals.append(float(tok[layers, b, i].mean()))
                assert row.n_queries == len(vals)
                assert row.mean == pytest.approx(np.mean(vals), abs=1e-12)
                assert row.low == pytest.approx(min(vals)) and row.high == pytest.approx(max(vals))
            assert got.n_queries.sum() == 12 + 8  # every real query, once


def test_per_layer_means_skip_early_positions():
    res = synthetic()
    table = per_layer_means({"s": res}, ["contribution"], from_position=3)
    tok = res.weights["contribution"].sum(2).double()
    want = torch.cat([tok[:, 0, 2:], tok[:, 1, 6:]], -1).mean(-1)
    assert list(table.layer) == list(range(5)) and set(table.n_queries) == {10 + 6}
    np.testing.assert_allclose(table["mean"].to_numpy(), want.numpy(), rtol=1e-12)


def test_range_means_are_means_over_the_queries_of_the_range():
    gen = torch.Generator().manual_seed(2)
    values = torch.rand(200, generator=gen)
    positions = torch.arange(200) + 1
    rows = binned(values, positions, log_bins(200, 4))
    import pandas as pd

    curves = pd.DataFrame([{"key_set": "s", "group": "early", "metric": "attention", **r} for r in rows])
    wide = range_means(curves, start=16, factor=4)
    assert list(wide.columns) == ["key_set", "group", "metric", "16-63", "64-200"]
    for label, (a, b) in (("16-63", (16, 64)), ("64-200", (64, 201))):
        want = float(values[(positions >= a) & (positions < b)].double().mean())
        assert wide[label].iloc[0] == pytest.approx(want, abs=1e-12)
