"""Unit tier: the ranking scores (AUROC with ties, precision at |truth|) and attention
rollout against float64 naive computations from their definitions (no model)."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from cwlens.core.ranking_scores import (
    auroc,
    auroc_rows,
    midranks,
    midranks_rows,
    precision_at_k,
    precision_rows,
)
from cwlens.core.rollout import rollout
from cwlens.errors import InvalidArgumentError, NonFiniteError, ShapeMismatchError


def naive_auroc(scores, labels):
    """Every (positive, negative) pair: 1 if the positive scores higher, 0.5 on a tie."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return math.nan
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def naive_precision(scores, labels, k):
    """The mean over every order of the entries (each tie-break equally likely) of the
    positives among the first k after a stable sort by descending score."""
    n = len(scores)
    total, count = 0.0, 0
    for perm in itertools.permutations(range(n)):
        ranked = sorted(perm, key=lambda i: -scores[i])  # stable: ties keep perm's order
        total += sum(labels[i] for i in ranked[:k]) / k
        count += 1
    return total / count


values = st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 2.0]), min_size=2, max_size=6)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_auroc_equals_pairwise_count(data):
    s = data.draw(values)
    y = data.draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
    got = auroc(torch.tensor(s), torch.tensor(y))
    want = naive_auroc(s, y)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_precision_equals_mean_over_tie_breaks(data):
    s = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=6))
    y = data.draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
    k = data.draw(st.integers(1, len(s)))
    assert precision_at_k(torch.tensor(s), torch.tensor(y), k) == pytest.approx(
        naive_precision(s, y, k), abs=1e-12)


def test_known_values():
    y = torch.tensor([True, False, True, False])
    assert auroc(torch.tensor([4.0, 3.0, 2.0, 1.0]), y) == 0.75
    assert auroc(torch.tensor([1.0, 0.0, 1.0, 0.0]), y) == 1.0
    assert auroc(torch.tensor([0.0, 1.0, 0.0, 1.0]), y) == 0.0
    assert auroc(torch.zeros(4), y) == 0.5  # a constant score is chance, exactly
    assert precision_at_k(torch.tensor([4.0, 3.0, 2.0, 1.0]), y) == 0.5
    assert precision_at_k(torch.zeros(4), y) == 0.5  # P / N under random tie-breaking
    # the 2nd place falls in a tie of three (one positive): 1 + 1/3 of 2
    assert precision_at_k(torch.tensor([5.0, 1.0, 1.0, 1.0]), torch.tensor([True, True, False, False])) \
        == pytest.approx((1 + 1 / 3) / 2)
    assert math.isnan(auroc(torch.ones(3), torch.ones(3, dtype=torch.bool)))
    assert math.isnan(precision_at_k(torch.ones(3), torch.zeros(3, dtype=torch.bool)))


def test_midranks():
    assert_close(midranks(torch.tensor([3.0, 1.0, 3.0, 2.0])), torch.tensor([3.5, 1.0, 3.5, 2.0],
                                                                            dtype=torch.float64))


def test_bad_input_is_named():
    with pytest.raises(NonFiniteError, match="1 of 3 scores"):
        auroc(torch.tensor([0.0, math.nan, 1.0]), torch.tensor([True, False, True]))
    with pytest.raises(ShapeMismatchError, match=r"\[3\].*\[2\]"):
        auroc(torch.zeros(3), torch.zeros(2, dtype=torch.bool))
    with pytest.raises(InvalidArgumentError, match="got 5"):
        precision_at_k(torch.zeros(3), torch.zeros(3, dtype=torch.bool), 5)
    with pytest.raises(InvalidArgumentError, match="list"):
        auroc([0.0, 1.0], torch.zeros(2, dtype=torch.bool))


def naive_rollout(patterns):
    """Abnar & Zuidema's recipe, one layer at a time in float64 with Python loops."""
    n_layers, n_heads, n, _ = patterns.shape
    out = torch.eye(n, dtype=torch.float64)
    for layer in range(n_layers):
        a = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            for j in range(n):
                a[i, j] = sum(float(patterns[layer, h, i, j]) for h in range(n_heads)) / n_heads
                a[i, j] = 0.5 * a[i, j] + (0.5 if i == j else 0.0)
        a = a / a.sum(-1, keepdim=True)
        out = a @ out
    return out


def test_rollout_equals_naive():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 2, 5, 5, generator=g)
    mask = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    patterns = scores.masked_fill(~mask, -torch.inf).softmax(-1)
    got = rollout(patterns)
    assert_close(got, naive_rollout(patterns))
    assert_close(got.sum(-1), torch.ones(5, dtype=torch.float64))
    assert torch.equal(got.triu(1), torch.zeros(5, 5, dtype=torch.float64))  # still causal
    # extra leading axes (a batch) are carried: each sequence rolled out alone
    batch = torch.stack([patterns, patterns.flip(-3)], 1)  # [layer, batch, head, q, k]
    assert_close(rollout(batch)[1], naive_rollout(patterns.flip(-3)))


def test_rollout_refuses_bad_shapes():
    with pytest.raises(ShapeMismatchError, match=r"\[2, 3, 3\]"):
        rollout(torch.zeros(2, 3, 3))
    with pytest.raises(InvalidArgumentError, match="1.5"):
        rollout(torch.zeros(1, 1, 3, 3), residual_weight=1.5)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_row_versions_equal_the_scalar_ones(data):
    n = data.draw(st.integers(2, 9))
    rows = data.draw(st.integers(1, 4))
    s = torch.tensor(data.draw(st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, -2.0, 3.0]),
                                                 min_size=n, max_size=n), min_size=rows, max_size=rows)))
    y = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    got_a, got_p = auroc_rows(s, y), precision_rows(s, y)
    for r in range(rows):
        assert_close(midranks_rows(s)[r], midranks(s[r]))
        for got, want in ((got_a[r], auroc(s[r], y)), (got_p[r], precision_at_k(s[r], y))):
            assert (math.isnan(want) and math.isnan(float(got))) or float(got) == pytest.approx(want, abs=1e-12)
