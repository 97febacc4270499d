"""cwlens.circuits on tiny seeded models: completeness of the direct logit attribution,
token flows against a float64 composition from the definitions, and real hook_z patching."""

import pytest
import torch

from cwlens import circuits
from cwlens.circuits.patching import replace_heads_hook
from cwlens.circuits.tasks import TaskBuildError
from cwlens.engine import hook_names
from cwlens.engine.handle import wrap
from cwlens.errors import UnknownOptionError, UnsupportedModelError
from cwlens.testing import naive_measures, tiny_model

ARCHS = ("llama", "gpt2", "qwen3")
TOKENS = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 6], [1, 9, 8, 7, 6, 5, 11, 12]])


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    return tiny_model(request.param)


@pytest.fixture(scope="module")
def run(model):
    return circuits.run_with_cache(model, TOKENS)


@pytest.mark.parametrize("foils", [None, torch.tensor([[20, 21], [22, 23]])])
def test_direct_logit_attribution_is_complete(model, run, foils):
    logits, cache = run
    answers = torch.tensor([[30, 31], [32, 33]])
    dla = circuits.direct_logit_attribution(cache, model, logits, [4, 7], answers, foils)
    assert dla.head_terms.shape == (2, 2, 2, 4, 8)
    # heads x tokens + embedding + b_O + MLPs + constants = the model's logit difference
    torch.testing.assert_close(dla.total, dla.logit_diff, atol=2e-5, rtol=1e-5)
    assert dla.completeness_error < 2e-5
    assert dla.logit_diff.abs().max() > 1e-2  # not trivially zero


def test_direct_terms_match_the_definition(model, run):
    """a_ij <v~_j^h, u'> / s_i with v~ built explicitly and the final norm applied by hand."""
    logits, cache = run
    answers, foils, q = torch.tensor([[30], [32]]), torch.tensor([[20], [22]]), 7
    dla = circuits.direct_logit_attribution(cache, model, logits, [q], answers, foils)
    W_U = model.W_U.detach().double()
    w = model.ln_final.w.detach().double()
    centres = not str(model.cfg.normalization_type).startswith("RMS")
    scale = cache[hook_names.final_scale()][:, q, 0].double()
    for layer in range(model.cfg.n_layers):
        ref = naive_measures(cache[hook_names.pattern(layer)], cache[hook_names.values(layer)],
                             model.blocks[layer].attn.W_O.detach())
        for b in range(2):
            u = W_U[:, answers[b, 0]] - W_U[:, foils[b, 0]]
            for h in range(model.cfg.n_heads):
                for j in range(q + 1):
                    term = ref["attention"][b, h, q, j] * _vtilde(cache, model, layer, b, h, j)
                    if centres:
                        term = term - term.mean()
                    expected = (term * w / scale[b]) @ u
                    assert float(dla.head_terms[b, 0, layer, h, j]) == pytest.approx(float(expected), abs=1e-5)


def _vtilde(cache, model, layer, b, h, j):
    v = cache[hook_names.values(layer)][b, j].double()  # [kv, d]
    group = model.cfg.n_heads // v.shape[0]
    return v[h // group] @ model.blocks[layer].attn.W_O.detach().double()[h]


def test_head_shares_sum_to_one_per_layer(model, run):
    _, cache = run
    keys = torch.tensor([[2, 3], [2, 3]])
    scores = circuits.head_scores(cache, model, [4, 7], keys)
    torch.testing.assert_close(scores["contribution_share"].values.sum(-1),
                               torch.ones(model.cfg.n_layers, dtype=torch.float64), atol=1e-5, rtol=0)
    pattern = cache[hook_names.pattern(1)]
    expected = (pattern[0, :, 4, 2] + pattern[0, :, 7, 3] + pattern[1, :, 4, 2] + pattern[1, :, 7, 3]) / 4
    torch.testing.assert_close(scores["attention_key"].values[1], expected.double())


def _naive_flows(cache, model, b, rule):
    """flows[l+1][i, j] = sum_k F_l[i, k] flows[l][k, j], every factor from its definition."""
    n = TOKENS.shape[1]
    flows = [torch.eye(n, dtype=torch.float64)]
    for layer in range(model.cfg.n_layers):
        r = cache[hook_names.resid_pre(layer)][b].double()
        a = cache[hook_names.resid_mid(layer)][b].double() - r
        c = naive_measures(cache[hook_names.pattern(layer)], cache[hook_names.values(layer)],
                           model.blocks[layer].attn.W_O.detach())["contribution_inter"][b].sum(0)
        F = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            new = r[i] + a[i]
            dr, da = float(new @ r[i]), float(new @ a[i])
            if rule == "projection":  # key j's term z_ij = sum_h a_ij^h v~_j^h, b_O spread by C
                pattern = cache[hook_names.pattern(layer)][b].double()
                b_O = wrap(model).b_O(layer).detach().double()
                for j in range(n):
                    z = sum(pattern[h, i, j] * _vtilde(cache, model, layer, b, h, j)
                            for h in range(model.cfg.n_heads))
                    F[i, j] = float(new @ z) / float(new @ new) + float(new @ b_O) / float(new @ new) * c[i, j]
                F[i, i] += dr / float(new @ new)
                continue
            if rule == "signed":
                s_res, s_att, row = dr / float(new @ new), da / float(new @ new), c[i]
            else:
                s_res, s_att = abs(dr) / (abs(dr) + abs(da)), abs(da) / (abs(dr) + abs(da))
                row = c[i].abs() / c[i].abs().sum()
            for j in range(n):
                F[i, j] = s_att * row[j] + (s_res if i == j else 0.0)
        nxt = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            for j in range(n):
                nxt[i, j] = sum(F[i, k] * flows[-1][k, j] for k in range(n))
        flows.append(nxt)
    return torch.stack(flows)


@pytest.mark.parametrize("rule", ["signed", "absolute", "projection"])
def test_token_flow_equals_naive_composition(model, run, rule):
    _, cache = run
    for b in range(2):
        flow = circuits.token_flow(cache, model, batch=b, rule=rule)
        torch.testing.assert_close(flow.flows, _naive_flows(cache, model, b, rule), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(flow.flows.sum(-1), torch.ones_like(flow.flows[..., 0]))
        torch.testing.assert_close(flow.input_attribution(-1), flow.flows[-1][-1])
        edges = flow.edges(threshold=0.0)
        per_layer = [sum(e["weight"] for e in edges if e["layer"] == ly) for ly in range(2)]
        assert per_layer == pytest.approx([1.0, 1.0])
        assert set(edges[0]) == {"layer", "from_pos", "to_pos", "weight", "from_token", "to_token"}


def test_unsupported_model_is_refused():
    gemma = tiny_model("gemma3")
    logits, cache = circuits.run_with_cache(gemma, TOKENS)
    # refused up front, naming the norm after attention (on TransformerLens 4.x too, issue 17)
    with pytest.raises(UnsupportedModelError, match="a norm after attention"):
        circuits.direct_logit_attribution(cache, gemma, logits, [3], torch.tensor([[5], [6]]))
    with pytest.raises(UnsupportedModelError, match="a norm after attention"):
        circuits.token_flow(cache, gemma)


def test_hook_z_patching_is_real():
    """Patching the last layer's head h moves resid_mid by exactly (z' - z) W_O^h."""
    m = tiny_model("llama")
    clean, corrupted = TOKENS, TOKENS.flip(0)
    last = m.cfg.n_layers - 1
    names = {hook_names.z(last), hook_names.resid_mid(last)}
    _, cc = m.run_with_cache(clean, names_filter=lambda n: n in names)
    _, cx = m.run_with_cache(corrupted, names_filter=lambda n: n in names)
    captured = {}
    resid_before = cc[hook_names.resid_mid(last)]

    def grab(x, hook):
        captured["resid"] = x.detach().clone()

    hook = replace_heads_hook(cx[hook_names.z(last)], batch=2)
    with torch.no_grad(), m.hooks(fwd_hooks=[(hook_names.z(last), hook), (hook_names.resid_mid(last), grab)]):
        m(clean.repeat(m.cfg.n_heads, 1))
    W_O = m.blocks[last].attn.W_O.detach()
    for h in range(m.cfg.n_heads):
        dz = cx[hook_names.z(last)][:, :, h] - cc[hook_names.z(last)][:, :, h]
        expected = resid_before + dz @ W_O[h]
        torch.testing.assert_close(captured["resid"][2 * h : 2 * h + 2], expected, atol=1e-5, rtol=1e-4)
    effect = circuits.patch_heads(m, clean, lambda lg: lg[:, -1, 30] - lg[:, -1, 20], corrupted)
    assert effect.values.abs().max() > 0
    same = circuits.patch_heads(m, clean, lambda lg: lg[:, -1, 30] - lg[:, -1, 20], clean)
    assert same.values.abs().max() == 0
    assert not any(p.fwd_hooks for p in m.hook_dict.values())  # nothing left behind


TINY_TASKS = {
    "ioi": dict(names=("mary", "john", "cat", "dog"), places=("store", "house"), objects=("drink", "bottle"), n_prompts=4),
    "induction": dict(length=6, n_prompts=3),
    "capitals": dict(pairs=(("france", "paris"), ("england", "london")), template="the capital of {} is"),
}


@pytest.mark.parametrize("task", sorted(TINY_TASKS))
def test_compare_with_patching_runs_on_tiny_tasks(task):
    m = tiny_model("llama")
    t = circuits.build_task(task, m, **TINY_TASKS[task])
    assert t.clean.shape == t.corrupted.shape and t.answers.shape == t.keys.shape
    c = circuits.compare_with_patching(m, t, k=3)
    assert {a.score for a in c.agreements} == {"contribution_share", "contribution_key", "attention_key", "direct_logit"}
    assert c.dla.completeness_error < 1e-4
    df = c.to_dataframe()
    assert len(df) == 8 and "patching" in df.columns
    assert "agreement with patching over 8 heads" in c.format(top=3)


def test_ioi_corrupts_with_three_random_names_by_default():
    """Wang et al.'s p_ABC: the same template with three distinct names, independent of the
    clean ones; 'swap' keeps the old corruption (the second subject becomes the IO)."""
    m = tiny_model("llama")
    kw = dict(TINY_TASKS["ioi"], names=("mary", "john", "cat", "dog", "car"), n_prompts=6)
    abc = circuits.build_task("ioi", m, **kw)
    swap = circuits.build_task("ioi", m, **kw, corruption="swap")
    assert torch.equal(abc.clean, swap.clean)  # the same clean prompts either way
    name_ids = {m.to_tokens(" " + w, prepend_bos=False)[0, 0].item() for w in kw["names"]}
    for clean, corr, io in zip(swap.clean, swap.corrupted, swap.answers[:, 0], strict=True):
        diff = (clean != corr).nonzero().flatten().tolist()
        assert len(diff) == 1 and corr[diff[0]] == io  # S2 -> IO
    changed = 0
    for clean, corr in zip(abc.clean, abc.corrupted, strict=True):
        where = [i for i, t in enumerate(clean.tolist()) if t in name_ids]
        assert len(where) == 3  # A, B, B
        new = [int(corr[i]) for i in where]
        assert len(set(new)) == 3 and set(new) <= name_ids  # C, D, E distinct
        keep = [i for i in range(len(clean)) if i not in where]
        assert torch.equal(clean[keep], corr[keep])  # the template is unchanged
        changed += new != [int(clean[i]) for i in where]
    assert changed == len(abc.clean)
    with pytest.raises(UnknownOptionError, match="'abc'"):
        circuits.build_task("ioi", m, **kw, corruption="flip")


def test_task_errors_name_the_fix():
    m = tiny_model("llama")
    with pytest.raises(TaskBuildError, match="single-token answers"):
        circuits.build_task("capitals", m, pairs=(("xx yy", "zz ww"), ("aa bb", "cc dd")))
    with pytest.raises(UnknownOptionError, match="Valid tasks"):
        circuits.build_task("greater_than", m)


@pytest.mark.parametrize("k", [8, 9])
def test_a_top_k_covering_every_head_is_refused(k):
    """k >= the number of heads (8 here) reported a top-k overlap of 1.00 by construction."""
    from cwlens.errors import InvalidArgumentError

    m = tiny_model("llama")
    t = circuits.build_task("induction", m, **TINY_TASKS["induction"])
    with pytest.raises(InvalidArgumentError, match="covers all 8 heads"):
        circuits.compare_with_patching(m, t, k=k)
