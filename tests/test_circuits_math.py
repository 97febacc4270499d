"""cwlens.circuits' pure parts: rankings, agreement and the token-flow algebra (no model)."""

import pytest
import torch

from cwlens.circuits import flow_math
from cwlens.circuits.results import HeadScores, agreement, ranks, spearman, top_k_overlap
from cwlens.errors import CwlensError, ShapeMismatchError


def test_ranks_average_ties():
    torch.testing.assert_close(ranks(torch.tensor([3.0, 1.0, 3.0, 2.0])),
                               torch.tensor([3.5, 1.0, 3.5, 2.0], dtype=torch.float64))


def test_spearman_known_values():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert spearman(a, a ** 3) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    # textbook example: d = rank differences, rho = 1 - 6 sum d^2 / (n (n^2 - 1))
    b = torch.tensor([2.0, 1.0, 4.0, 3.0, 5.0])
    assert spearman(a, b) == pytest.approx(1 - 6 * 4 / (5 * 24))
    assert spearman(a, torch.ones(5)) != spearman(a, torch.ones(5))  # NaN for a constant


def test_top_k_overlap_and_agreement():
    s = HeadScores("s", torch.tensor([[4.0, 3.0], [2.0, 1.0]], dtype=torch.float64))
    r = HeadScores("patching", torch.tensor([[4.0, 1.0], [2.0, 3.0]], dtype=torch.float64))
    assert top_k_overlap(s.flat(), r.flat(), 2) == 0.5
    ag = agreement(s, r, k=2)
    assert ag.top_k_overlap == 0.5 and ag.n_heads == 4 and ag.spearman == pytest.approx(1 - 6 * 8 / (4 * 15))
    # union of the top 2s: heads 0, 1 (score) and 0, 3 (patching) -> ranks (3,2,1) vs (3,1,2)
    assert ag.spearman_top == pytest.approx(0.5)
    assert s.top(2) == [("L0H0", 4.0), ("L0H1", 3.0)]
    assert s.rank_of("L1H0") == 3
    df = s.to_dataframe()
    assert list(df.columns) == ["layer", "head", "label", "s"] and len(df) == 4
    with pytest.raises(ShapeMismatchError, match=r"\[layer, head\]"):
        agreement(s, HeadScores("p", torch.zeros(3, 2)))


def _random_stream(n=6, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(n, d, generator=g, dtype=torch.float64)
    a = torch.randn(n, d, generator=g, dtype=torch.float64)
    c = torch.randn(n, n, generator=g, dtype=torch.float64).tril()
    c = c / c.sum(-1, keepdim=True)  # rows sum to 1, signed entries
    return r, a, c


@pytest.mark.parametrize("rule", flow_math.RULES)
def test_layer_flow_rows_sum_to_one(rule):
    r, a, c = _random_stream()
    # rule="projection" also takes <r'_i, z_ij> (keys' terms, here b_O = a - sum_j z_ij)
    z = torch.randn(6, 6, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    dots = ((r + a)[:, None, :] * z).sum(-1)
    f = flow_math.layer_flow(r, a, c, rule, dots)
    torch.testing.assert_close(f.sum(-1), torch.ones(6, dtype=torch.float64))
    if rule == "absolute":
        assert (f >= 0).all()
    else:  # the signed shares are the projections, and they can be negative
        s_res, s_att = flow_math.residual_shares(r, a, rule)
        new = r + a
        torch.testing.assert_close(s_att, (new * a).sum(-1) / (new * new).sum(-1))
        assert (f < 0).any()


def test_compose_and_graph():
    layers = torch.stack([flow_math.layer_flow(*_random_stream(seed=s), "absolute") for s in range(3)])
    flows = flow_math.compose(layers)
    torch.testing.assert_close(flows[0], torch.eye(6, dtype=torch.float64))
    torch.testing.assert_close(flows[3], layers[2] @ layers[1] @ layers[0])
    nodes = flow_math.node_importance(layers, target=4)
    torch.testing.assert_close(nodes[0], flows[3][4])
    edges = flow_math.edge_weights(layers, target=4)
    torch.testing.assert_close(edges.sum((-1, -2)), torch.ones(3, dtype=torch.float64))
    assert nodes[:, 5].abs().max() == 0  # causal: nothing after the target is used


def test_unknown_rule_is_a_cwlens_error():
    with pytest.raises(CwlensError, match="Valid rules: 'signed'"):
        flow_math.layer_flow(*_random_stream(), rule="alti")
