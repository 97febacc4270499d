"""cwlens.graph (issue 48.1): the streamed graph's edges are token_flow's (signed rule) and
the measure functions' token-level weights times the attention's share, on every tiny
architecture (under whichever TransformerLens runs the tests: 4.x or 3.x)."""

import numpy as np
import pytest
import torch

import cwlens
from cwlens.engine import adapter, hook_names
from cwlens.engine.handle import wrap
from cwlens.graphs.routes import route_mask
from cwlens.testing import ARCHITECTURES, tiny_model

TEXT = "when mary and john went to the store , john gave a bottle of milk to"
METRICS = ("contribution", "attention", "value_weighted", "contribution_abs")


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch(request):
    model = tiny_model(request.param)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, TEXT, residual=True)
    return request.param, model, cache


def _full_rows(cache, model, layer, metric):
    """``F`` ``[query, key]`` from the measure functions: the metric's token-level weight
    (rows scaled to 1 unless contribution), times s_att, plus s_res on the diagonal."""
    w = cwlens.importance(cache, model, layer, metric)[0].double()  # [head, q, k]
    token = w.sum(0)
    if metric != "contribution":
        total = token.sum(-1, keepdim=True)
        token = torch.where(total != 0, token / total, torch.zeros_like(token))
    r = adapter.read(cache, hook_names.resid_pre(layer), wrap(model))[0].double()
    geo = adapter.geometry(cache, wrap(model), layer)
    a = geo.layer_output[0].double() + wrap(model).b_O(layer).double()
    new = r + a
    norm = (new * new).sum(-1)
    s_res, s_att = (new * r).sum(-1) / norm, (new * a).sum(-1) / norm
    return s_att[:, None] * token + torch.diag(s_res), s_res


@pytest.mark.parametrize("metric", METRICS)
def test_edges_are_the_measure_functions_weights(arch, metric):
    name, model, cache = arch
    g = cwlens.graph(model, TEXT, metric=metric, top_k=4, compare=None)
    n = g.n_positions
    assert g.layers == (1, 2) and g.weight.shape == (2, n, 5)
    for b, layer in enumerate(g.blocks):
        full, s_res = _full_rows(cache, model, layer, metric)
        np.testing.assert_allclose(g.residual[b], s_res.numpy(), atol=2e-5)
        for i in range(n):
            ok = g.from_position[b, i] >= 0
            j = g.from_position[b, i][ok]
            assert j[0] == i  # slot 0: the self edge
            np.testing.assert_allclose(g.weight[b, i][ok], full[i, j].numpy(), atol=2e-5)
            # the other slots are the strongest keys, strongest first
            row = full[i].abs().clone()
            row[i] = -1
            if name != "bert":
                row[i + 1:] = -1
            if name == "gemma3" and layer == 0:  # sliding window of 8
                row[: max(0, i - 7)] = -1
            want = int((row >= 0).sum().clamp_max(4))
            assert ok[1:].sum() == want
            got = full[i, j[1:]].abs().numpy()
            np.testing.assert_allclose(np.sort(got)[::-1], got, atol=1e-6)
            top = row.topk(want).values.numpy()
            np.testing.assert_allclose(got, top, atol=2e-5)


def test_rows_sum_to_one_with_every_edge_kept(arch):
    _, model, _ = arch
    g = cwlens.graph(model, TEXT, top_k=64, compare="attention")
    for h in (g, g.compare):
        total = np.nansum(h.weight, -1)
        np.testing.assert_allclose(total, 1.0, atol=2e-5)
        parts = np.nansum(h.heads, (-1, -2)) + h.residual
        np.testing.assert_allclose(parts, 1.0, atol=2e-5)


@pytest.mark.parametrize("arch_name", ["llama", "gpt2", "qwen3"])
def test_contribution_edges_are_token_flows_signed_layer_flows(arch_name):
    model = tiny_model(arch_name)
    _, cache = cwlens.run_with_cache(model, TEXT, residual=True)
    from cwlens.circuits import token_flow

    flow = token_flow(cache, model, rule="signed")
    g = cwlens.graph(model, TEXT, top_k=64, compare=None)
    b, i, s = np.nonzero(g.valid)
    j = g.from_position[b, i, s]
    want = flow.layer_flows[b, i, j].numpy()
    np.testing.assert_allclose(g.weight[b, i, s], want, atol=2e-5)
    assert g.valid.sum() == int(flow.support.sum())  # every edge that exists, once


def test_factor_split_multiplies_to_the_heads_weight(arch):
    _, model, cache = arch
    g = cwlens.graph(model, TEXT, top_k=3, compare=None)
    dec = [cwlens.decompose(cache, model, ly) for ly in g.blocks]
    for b in range(len(g.blocks)):
        for i in (0, 5, g.n_positions - 1):
            for row in g.node(b + 1, i):
                for f in row["factors"]:
                    prod = f["attention"] * f["relative_norm"] * f["cosine"]
                    s_att = g.attention[b, i]
                    assert prod * s_att == pytest.approx(f["weight"], abs=2e-6)
                    d = dec[b]
                    h, j = f["head"], row["from_position"]
                    assert f["attention"] == pytest.approx(float(d.attention[0, h, i, j]), abs=1e-6)
                    assert f["relative_norm"] == pytest.approx(float(d.relative_norm[0, h, i, j]), rel=1e-4, abs=1e-6)


def test_blockwise_and_small_query_blocks_give_the_same_graph():
    model = tiny_model("llama")
    g = cwlens.graph(model, TEXT, top_k=3)
    blockwise = wrap(model).supports_blockwise  # TransformerLens 4.x
    h = cwlens.graph(model, TEXT, top_k=3, attention="blockwise" if blockwise else "eager",
                     query_block=3)
    np.testing.assert_array_equal(g.from_position, h.from_position)
    np.testing.assert_allclose(g.weight, h.weight, atol=1e-6)
    np.testing.assert_allclose(g.compare.weight, h.compare.weight, atol=1e-6)
    np.testing.assert_allclose(g.factors, h.factors, atol=1e-5)


def test_node_rows_and_the_table_agree():
    model = tiny_model("llama")
    g = cwlens.graph(model, TEXT, top_k=3)
    df = g.to_pandas()
    assert len(df) == g.valid.sum() == g.visible_edges()
    rows = g.node(2, 7)
    sub = df[(df.layer == 2) & (df.position == 7)].sort_values("rank")
    assert [r["from_position"] for r in rows] == sub.from_position.tolist()
    np.testing.assert_allclose([r["weight"] for r in rows], sub.weight, atol=0)
    np.testing.assert_allclose(rows[1]["heads"], sub.iloc[1][[f"head_{h}" for h in range(4)]].to_numpy(float))
    assert rows[0]["from_layer"] == 1 and rows[0]["residual"] == pytest.approx(float(g.residual[1, 7]))
    for t in (0.0, 0.05, 0.2):
        for k in (0, 1, 3):
            want = ((df.weight.abs() >= t) & (df["rank"] <= k)).sum()
            assert g.visible_edges(t, k) == want
    with pytest.raises(cwlens.errors.CwlensError, match="node layer 0"):
        g.node(0, 1)
    with pytest.raises(cwlens.errors.CwlensError, match="out of range"):
        g.node(1, 99)


def test_routes_keep_the_strong_edges_on_paths_to_the_target():
    from_position = np.array([[[0, -1], [1, 0], [2, 1]],  # block 0: into layer 1
                              [[0, -1], [1, 0], [2, 0]]])  # block 1: into layer 2
    weight = np.array([[[1.0, np.nan], [0.5, 0.5], [0.9, 0.1]],
                       [[1.0, np.nan], [0.97, 0.03], [0.6, 0.4]]])
    keep = route_mask(from_position, weight, 2, 0.2)
    # top: node 2 keeps 2<-2 and 2<-0; below, node 2 keeps 2<-2 (not 2<-1 at 0.1), node 0 keeps 0<-0
    assert keep[1].tolist() == [[False, False], [False, False], [True, True]]
    assert keep[0].tolist() == [[True, False], [False, False], [True, False]]
    assert route_mask(from_position, -weight, 2, 0.2, absolute=True).tolist() == keep.tolist()


def test_routes_subgraph_of_a_real_graph():
    model = tiny_model("llama")
    g = cwlens.graph(model, TEXT, top_k=4)
    r = g.routes(target=-1, threshold=0.04)
    assert r.route == {"target": g.n_positions - 1, "threshold": 0.04, "absolute": False}
    df = r.to_pandas()
    assert len(df) and (df.weight >= 0.04).all()
    top = df[df.layer == 2]
    assert set(top.position) == {g.n_positions - 1}
    below = df[df.layer == 1]
    assert set(below.position) <= set(top.from_position)
    assert r.compare is not None and r.compare.route["target"] == g.n_positions - 1
    assert "routes to position" in repr(r)


def test_bad_arguments_are_refused():
    model = tiny_model("llama")
    with pytest.raises(cwlens.errors.CwlensError, match="compare"):
        cwlens.graph(model, TEXT, compare="contribution")
    with pytest.raises(cwlens.errors.CwlensError, match="one text"):
        cwlens.graph(model, [TEXT, TEXT])
    with pytest.raises(cwlens.errors.CwlensError):
        cwlens.graph(model, TEXT, metric="nope")
    with pytest.raises(cwlens.errors.CwlensError):
        cwlens.graph(model, TEXT, top_k=0)


def test_a_subset_of_layers_gives_those_layers_edges():
    model = tiny_model("llama")
    full = cwlens.graph(model, TEXT, top_k=3)
    part = cwlens.graph(model, TEXT, top_k=3, layers=[1])
    assert part.blocks == (1,) and part.layers == (2,)
    for pos in (0, 7, -1):
        assert part.node(2, pos) == full.node(2, pos)
    with pytest.raises(cwlens.errors.CwlensError, match="node layer 1"):
        part.node(1, 0)
    with pytest.raises(cwlens.errors.CwlensError):
        cwlens.graph(model, TEXT, layers=[5])
