"""The per-edge truth (cwlens.groundtruth.edge_effects): its identities, its two paths
against each other, against an independent hook computation and against a closed form."""

import pytest
import torch

from cwlens.engine import hook_names
from cwlens.engine.handle import wrap
from cwlens.engine.interventions.edge_removal import softmax_in_model_dtype
from cwlens.errors import InvalidArgumentError, UnknownOptionError
from cwlens.groundtruth.edges import Reader, edge_effects, joint_effects, model_in
from cwlens.testing import tiny_model


def _has_hooked_transformer() -> bool:
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:  # TransformerLens 4.x removed it
        return False
    return True


TL3 = _has_hooked_transformer()
TOKENS = torch.tensor([1, 5, 9, 3, 7, 2, 8, 4, 4, 6, 1, 2])
DECODERS = ("llama", "gpt2", "gemma3", "qwen3")


@pytest.fixture(scope="module", params=DECODERS)
def decoder(request):
    return request.param, tiny_model(request.param)


def _zero_head(query: int, head: int):
    """A ``hook_z`` hook zeroing ``head``'s output at ``query``."""

    def zero(z, hook):
        z = z.clone()
        z[:, query, head] = 0
        return z

    return zero


def _independent(model, tokens, query, layer, head, key, objective="logprob", target=None):
    """The effect of one edge by a plain hook on what the heads wrote in the residual
    space (``o_proj``'s output on the bridge, ``hook_attn_out`` on 3.x), a whole forward
    in float64 (the bridge's softmax too, as edge_effects runs it): subtract
    ``a_ij^h v_j W_O^h`` there."""
    m = model_in(model, torch.float64)
    h = wrap(m)
    with softmax_in_model_dtype(h):
        return _independent_run(m, h, tokens, query, layer, head, key, objective, target)


def _independent_run(m, h, tokens, query, layer, head, key, objective, target):
    toks = tokens[None, :query + 1]
    names = {hook_names.pattern(layer), hook_names.values(layer)}
    logits, cache = h.cached_run(toks, names.__contains__)
    a = cache[hook_names.pattern(layer)][0, head, query, key]
    v = cache[hook_names.values(layer)][0]
    v_j = v[key, head // (h.n_heads // v.shape[1])]
    term = a * v_j @ h.W_O(layer)[head]
    target_name = hook_names.closure_target(layer, h.generation, h.info.post_attn_norm)
    per_head = target_name == hook_names.z(layer)  # 3.x with a post-attention norm (Gemma-3):
    if per_head:  # each head's output in the residual space, hook_result
        target_name = f"blocks.{layer}.attn.hook_result"

    def subtract(x, hook):
        x = x.clone()
        if per_head:
            x[:, query, head] -= term
        else:
            x[:, query] -= term
        return x

    reader = Reader(objective, target if target is not None else int(logits[0, query].argmax()))
    clean = float(reader(logits[:, query].detach())[0])
    if per_head:
        m.set_use_attn_result(True)
    try:
        with h.hooks([(target_name, subtract)]):
            ablated = float(reader(m(toks)[:, query].detach())[0])
    finally:
        if per_head:
            m.set_use_attn_result(False)
    return clean - ablated


def test_prefix_path_equals_whole_forwards(decoder):
    arch, model = decoder
    full = edge_effects(model, TOKENS, path="full")
    if wrap(model).generation == "hooked":  # TransformerLens 3.x: the full path only
        with pytest.raises(InvalidArgumentError, match="TransformerBridge"):
            edge_effects(model, TOKENS, path="prefix")
        assert edge_effects(model, TOKENS).path == "full"
        return
    prefix = edge_effects(model, TOKENS, path="prefix")
    assert prefix.path == "prefix" and full.path == "full"
    assert torch.equal(full.alpha, prefix.alpha)
    torch.testing.assert_close(prefix.effect, full.effect, rtol=0, atol=1e-12)
    assert full.effect.abs().max() > 1e-4  # something is measured


@pytest.mark.parametrize("query", [4, -1])
def test_equals_an_independent_hook_computation(decoder, query):
    arch, model = decoder
    fx = edge_effects(model, TOKENS, query=query)
    q = fx.query
    g = torch.Generator().manual_seed(1)
    picked = fx.eligible.nonzero()[torch.randperm(fx.n_edges, generator=g)[:6]]
    for li, h, k in picked.tolist():
        want = _independent(model, TOKENS, q, fx.layers[li], h, k)
        assert abs(float(fx.effect[li, h, k]) - want) < 1e-9, (arch, li, h, k)


def test_removing_all_edges_of_a_head_equals_zeroing_its_output(decoder):
    arch, model = decoder
    fx = edge_effects(model, TOKENS, layers=[1])
    m = model_in(model, torch.float64)
    h = wrap(m)
    toks = fx.tokens[None]
    q = fx.query
    for head in range(h.n_heads):
        keys = fx.eligible[0, head].nonzero()[:, 0]
        joint = float(joint_effects(model, fx, [(0, torch.full_like(keys, head), keys)])[0])

        reader = Reader("logprob", fx.target)
        with h.hooks([(hook_names.z(1), _zero_head(q, head))]), softmax_in_model_dtype(h):
            zeroed = float(reader(m(toks)[:, q])[0])
        assert abs(joint - (fx.clean - zeroed)) < 1e-9, (arch, head)


@pytest.mark.parametrize("arch", ["mistral", "deepseek"])
def test_prefix_path_on_the_other_decoders(arch):
    model = tiny_model(arch)
    fx = edge_effects(model, TOKENS, layers=[1])
    full = edge_effects(model, TOKENS, layers=[1], path="full")
    torch.testing.assert_close(fx.effect, full.effect, rtol=0, atol=1e-12)
    assert fx.effect.abs().max() > 1e-6


def test_an_edge_without_attention_has_no_effect():
    model = tiny_model("gemma3")  # layer 0 slides a window: keys outside it get a = 0
    tokens = torch.arange(1, 13)
    fx = edge_effects(model, tokens)
    absent = fx.alpha == 0
    assert absent.any()
    assert (fx.effect[absent] == 0).all()
    assert not fx.eligible[absent].any()


@pytest.mark.parametrize("objective,target", [("kl", None), ("nll", None), ("logit_diff", (3, 7)),
                                              ("logprob", 11)])
def test_objectives_on_both_paths(objective, target):
    model = tiny_model("llama")
    query = -2 if objective == "nll" else -1
    full = edge_effects(model, TOKENS, query=query, objective=objective, target=target, path="full")
    prefix = edge_effects(model, TOKENS, query=query, objective=objective, target=target)
    torch.testing.assert_close(prefix.effect, full.effect, rtol=0, atol=1e-12)
    if objective == "kl":
        assert (full.effect[full.eligible] >= -1e-15).all() and full.clean == 0
    if objective == "nll":
        assert full.target == int(TOKENS[-1])  # the true next token of query -2


def test_float32_is_close_to_float64():
    model = tiny_model("llama")
    f64 = edge_effects(model, TOKENS)
    f32 = edge_effects(model, TOKENS, dtype=torch.float32)
    assert f32.dtype == torch.float32
    torch.testing.assert_close(f32.effect, f64.effect, rtol=0, atol=1e-5)


def test_encoder_edges_run_whole_forwards():
    model = tiny_model("bert")
    fx = edge_effects(model, TOKENS, query=3, layers=[0, 1])
    assert fx.path == "full" and fx.effect.shape[-1] == len(TOKENS)
    m = model_in(model, torch.float64)
    h = wrap(m)
    keys = fx.eligible[1, 0].nonzero()[:, 0]
    joint = float(joint_effects(model, fx, [(1, torch.zeros_like(keys), keys)])[0])

    reader = Reader("logprob", fx.target)
    with h.hooks([(hook_names.z(1), _zero_head(3, 0))]):
        zeroed = float(reader(m(fx.tokens[None])[:, 3])[0])
    assert abs(joint - (fx.clean - zeroed)) < 1e-9
    with pytest.raises(InvalidArgumentError, match="encoder|TransformerBridge"):
        edge_effects(model, TOKENS, query=3, path="prefix")


def test_encoder_embedding_objective_is_the_sentence_embeddings_damage():
    """objective='embedding': effect = 1 - cos of the mean-pooled last hidden state, by an
    independent hook on what the heads wrote (BERT's attention output), and a head's
    edges together = zeroing its output at the query; a decoder is refused."""
    model = tiny_model("bert")
    fx = edge_effects(model, TOKENS, query=3, layers=[0, 1], objective="embedding")
    assert fx.clean == pytest.approx(1.0) and fx.target is None
    # second order in the removed term (1 - cos of a small change): tiny on a tiny model
    assert (fx.effect[fx.eligible] >= -1e-15).all() and fx.effect.abs().max() > 1e-9
    m = model_in(model, torch.float64)
    h = wrap(m)
    last = hook_names.resid_post(h.n_layers - 1)

    def embedding(hooks):
        kept = {}
        with torch.no_grad(), h.hooks(hooks + [(last, lambda x, hook: kept.update(x=x))]):
            m(fx.tokens[None])
        return kept["x"][0].double().mean(0)

    clean = embedding([])
    g = torch.Generator().manual_seed(2)
    for li, head, key in fx.eligible.nonzero()[torch.randperm(fx.n_edges, generator=g)[:4]].tolist():
        layer = fx.layers[li]
        _, cache = h.cached_run(fx.tokens[None], {hook_names.pattern(layer), hook_names.values(layer)}.__contains__)
        a = cache[hook_names.pattern(layer)][0, head, 3, key]
        term = a * cache[hook_names.values(layer)][0, key, head] @ h.W_O(layer)[head]

        def subtract(x, hook, term=term):
            x = x.clone()
            x[:, 3] -= term
            return x

        target = hook_names.closure_target(layer, h.generation, h.info.post_attn_norm)
        e = embedding([(target, subtract)])
        want = 1 - float(torch.nn.functional.cosine_similarity(e, clean, dim=0))
        assert abs(float(fx.effect[li, head, key]) - want) <= 1e-6 * want + 1e-14, (li, head, key)
    keys = fx.eligible[1, 0].nonzero()[:, 0]
    joint = float(joint_effects(model, fx, [(1, torch.zeros_like(keys), keys)])[0])

    e = embedding([(hook_names.z(1), _zero_head(3, 0))])
    want = 1 - float(torch.nn.functional.cosine_similarity(e, clean, dim=0))
    assert want > 1e-9 and abs(joint - want) <= 1e-6 * want + 1e-14
    with pytest.raises(InvalidArgumentError, match="encoder"):
        edge_effects(tiny_model("llama"), TOKENS, objective="embedding")
    with pytest.raises(InvalidArgumentError, match="no target"):
        edge_effects(model, TOKENS, query=3, objective="embedding", target=3)


def test_score_identities():
    model = tiny_model("llama")
    fx = edge_effects(model, TOKENS)
    same = fx.score(fx.effect.clone())
    flipped = fx.score(-fx.effect)
    for layer in fx.layers:
        assert same[layer]["spearman_abs"] == pytest.approx(1.0)
        assert same[layer]["spearman_signed"] == pytest.approx(1.0)
        assert same[layer]["captured"][5] == pytest.approx(1.0)
        assert same[layer]["topk_recall"][5] == 1.0
        assert flipped[layer]["spearman_signed"] == pytest.approx(-1.0)
        assert flipped[layer]["spearman_abs"] == pytest.approx(1.0)
    with pytest.raises(InvalidArgumentError, match="shaped like"):
        fx.score(fx.effect[:1])


def test_bad_arguments_name_the_fix():
    model = tiny_model("llama")
    with pytest.raises(UnknownOptionError, match="objective"):
        edge_effects(model, TOKENS, objective="loss")
    with pytest.raises(InvalidArgumentError, match=r"target=\(a, b\)"):
        edge_effects(model, TOKENS, objective="logit_diff")
    with pytest.raises(InvalidArgumentError, match="next token"):
        edge_effects(model, TOKENS, objective="nll")
    with pytest.raises(InvalidArgumentError, match="outside"):
        edge_effects(model, TOKENS, query=12)
    with pytest.raises(InvalidArgumentError, match="one input"):
        edge_effects(model, torch.stack([TOKENS, TOKENS]))
    with pytest.raises(InvalidArgumentError, match="token id"):
        edge_effects(model, TOKENS, target=10**9)


@pytest.mark.skipif(not TL3, reason="HookedTransformer (TransformerLens 3.x) only")
def test_one_layer_attention_only_closed_form():
    """No norm, no MLP: the logits are linear in the heads' terms, so removing an edge
    takes ``a_ij v~_j W_U`` off the query's logits."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=16, d_head=4, n_heads=4, n_ctx=32, d_vocab=20,
                                  attn_only=True, normalization_type=None, seed=3,
                                  positional_embedding_type="standard")
    model = HookedTransformer(cfg)
    tokens = torch.tensor([1, 4, 2, 9, 7, 3])
    fx = edge_effects(model, tokens)
    m = model_in(model, torch.float64)
    logits, cache = m.run_with_cache(tokens[None])
    a = cache["blocks.0.attn.hook_pattern"][0, :, -1, :]
    v = cache["blocks.0.attn.hook_v"][0]
    terms = torch.einsum("hk,khd,hdm,mv->hkv", a, v, m.W_O[0], m.W_U)  # [h, k, vocab]
    clean = logits[0, -1]
    t = int(clean.argmax())
    want = clean.log_softmax(-1)[t] - (clean - terms).log_softmax(-1)[..., t]
    torch.testing.assert_close(fx.effect[0], want, rtol=0, atol=1e-12)


@pytest.mark.skipif(not TL3, reason="HookedTransformer (TransformerLens 3.x) only")
@pytest.mark.parametrize("arch", DECODERS)
def test_hooked_transformer_runs_the_full_path(arch):
    hooked = tiny_model(arch, generation="hooked")
    fx = edge_effects(hooked, TOKENS)
    assert fx.path == "full"
    q = fx.query
    li, h, k = fx.eligible.nonzero()[0].tolist()
    assert abs(float(fx.effect[li, h, k]) - _independent(hooked, TOKENS, q, fx.layers[li], h, k)) < 1e-9


def test_a_float64_run_takes_the_bridges_softmax_in_float64():
    """TransformerLens 4.x's attention bridge upcasts its softmax to float32 only; inside
    edge_effects a float64 model's pattern is a float64 softmax (what makes the prefix
    path's rows, whose softmax sums run over other lengths, equal whole forwards)."""
    m = model_in(tiny_model("llama"), torch.float64)
    h = wrap(m)
    if h.generation != "bridge":
        pytest.skip("TransformerBridge (TransformerLens 4.x) only")
    name = hook_names.pattern(1)
    seen = {}

    def keep(x, hook):
        seen[hook.name] = x
        return x

    with torch.no_grad():
        with h.hooks([("blocks.1.attn.hook_attn_scores", keep)]):
            with h.hooks([(name, keep)]):
                m(TOKENS[None])
            plain = seen[name]
            with softmax_in_model_dtype(h), h.hooks([(name, keep)]):
                m(TOKENS[None])
            exact = seen[name]
    want = seen["blocks.1.attn.hook_attn_scores"].softmax(-1)
    assert exact.dtype == torch.float64
    torch.testing.assert_close(exact, want, rtol=0, atol=1e-15)
    assert (plain - want).abs().max() > 1e-12  # float32 round-off without it


def test_chunks_never_mix_first_layers_and_split_layers_evenly():
    from cwlens.engine.interventions.edge_removal import layer_chunks

    first = torch.tensor([3] * 10 + [1] * 3 + [5] * 4 + [3] * 2)  # 12 rows start at layer 3
    chunks = list(layer_chunks(first, 5))
    assert sorted(torch.cat(chunks).tolist()) == list(range(len(first)))  # every row once
    assert [int(first[c[0]]) for c in chunks] == [5, 3, 3, 3, 1]  # deepest first
    assert all(len(set(first[c].tolist())) == 1 for c in chunks)
    assert [len(c) for c in chunks] == [4, 4, 4, 4, 3]  # 12 rows at cap 5: 4 + 4 + 4, not 5 + 5 + 2


def test_rows_per_forward_do_not_change_float64_effects(monkeypatch):
    from cwlens.groundtruth import edges

    model = tiny_model("llama")
    whole = edge_effects(model, TOKENS, dtype=torch.float64).effect
    monkeypatch.setitem(edges.ROWS, "prefix", 7)  # chunks much smaller than a layer's edges
    split = edge_effects(model, TOKENS, dtype=torch.float64).effect
    assert torch.allclose(split, whole, rtol=0, atol=1e-12)


def test_a_float32_log_probability_is_read_exactly_where_the_prediction_is_saturated():
    from cwlens.groundtruth.edges import log_prob

    torch.manual_seed(0)
    logits = torch.randn(64, 5000) * 3
    logits[:32, 7] += 40  # p(7) ~ 1 - 1e-13: a saturated prediction
    exact = log_prob(logits.double(), 7)  # the float64 reading of the same float32 logits
    got = log_prob(logits, 7)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got[:32], exact[:32], rtol=1e-6, atol=1e-12)  # a plain float32 lse: ~1e-7 off
    torch.testing.assert_close(got[32:], exact[32:], rtol=0, atol=1e-5)
    torch.testing.assert_close(exact, logits.double().log_softmax(-1)[:, 7], rtol=0, atol=1e-12)
