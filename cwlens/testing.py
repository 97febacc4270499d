"""Reference implementations for tests: slow, float64, and deliberately naive.

They build the per-pair vectors ``a_ij v~_j^h`` (``[batch, head, query, key, d_model]``)
that the fast path never builds, so use them only at small sizes.
"""

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cwlens.core._types import Generation
from cwlens.engine.models.loading import load_model
from cwlens.graphs.result import ContributionGraph


def _projected(pattern, v, W_O, position_mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, v~)`` in float64: the pattern and the projected values ``v~ = v W_O``
    ``[b, head, key, d_model]`` (grouped kv heads repeated), pad rows and columns zeroed."""
    a, v = pattern.double(), v.double()
    if position_mask is not None:
        m = position_mask.double()
        a = a * m[:, None, :, None] * m[:, None, None, :]
        v = v * m[:, :, None, None]
    n_heads, n_kv = a.shape[1], v.shape[2]
    v_heads = v.repeat_interleave(n_heads // n_kv, dim=2)  # [b, k, h, d]
    return a, torch.einsum("bkhd,hdm->bhkm", v_heads, W_O.double())


def naive_measures(pattern, v, W_O, position_mask=None) -> dict[str, torch.Tensor]:
    """All measures of one layer, straight from the definitions, in float64.

    Returns a dict with ``attention``, ``value_weighted``,
    ``value_weighted_output_normalized_{intra,inter}``, ``contribution_{intra,inter}``,
    ``relative_norm_{intra,inter}``, ``cosine_{intra,inter}``, ``head_outputs`` and
    ``layer_output``.
    """
    a, v_tilde = _projected(pattern, v, W_O, position_mask)
    pairs = a[..., None] * v_tilde[:, :, None, :, :]  # [b, h, q, k, m]  (the big one)
    o_head = pairs.sum(3)  # [b, h, q, m]
    o = o_head.sum(1)  # [b, q, m]
    out = {"attention": a, "head_outputs": o_head.permute(0, 2, 1, 3), "layer_output": o}
    v_norm = v_tilde.norm(dim=-1)[:, :, None, :]  # [b, h, 1, k]
    out["value_weighted"] = a * v_norm
    for kind, target in (("intra", o_head), ("inter", o[:, None].expand_as(o_head))):
        t = target[:, :, :, None, :]  # [b, h, q, 1, m]
        t_norm = target.norm(dim=-1)[..., None]  # [b, h, q, 1]
        ok = t_norm > 0
        safe = torch.where(ok, t_norm, torch.ones_like(t_norm))
        zero = torch.zeros_like(a)
        out[f"contribution_{kind}"] = torch.where(ok, (pairs * t).sum(-1) / safe**2, zero)
        out[f"value_weighted_output_normalized_{kind}"] = torch.where(
            ok, a * v_norm / safe, zero
        )
        out[f"relative_norm_{kind}"] = torch.where(ok, v_norm / safe, zero)
        cos = torch.nn.functional.cosine_similarity(
            t.expand(*pairs.shape[:-1], t.shape[-1]),
            v_tilde[:, :, None, :, :].expand_as(pairs),
            dim=-1,
            eps=1e-300,
        )
        out[f"cosine_{kind}"] = torch.where(ok & (v_norm > 0), cos, zero)
    return out


def naive_alti(pattern, v, W_O, position_mask=None) -> dict[str, torch.Tensor]:
    """ALTI proximities (``alti_intra``, ``alti_inter``) straight from the definition, in
    float64, with the full ``[batch, head, query, key, d_model]`` parts: ``p = max(0,
    ||o||_1 - ||o - a v~||_1)`` normalised over the keys of a head (intra) or over every
    head and key of a query (inter); rows whose ``p`` are all 0 stay 0."""
    a, v_tilde = _projected(pattern, v, W_O, position_mask)
    parts = a[..., None] * v_tilde[:, :, None, :, :]  # [b, h, q, k, m]
    o_head = parts.sum(3, keepdim=True)  # [b, h, q, 1, m]
    o = o_head.sum(1, keepdim=True)  # [b, 1, q, 1, m]
    out = {}
    for kind, whole, dims in (("intra", o_head, (-1,)), ("inter", o, (1, 3))):
        p = (whole.abs().sum(-1) - (whole - parts).abs().sum(-1)).clamp_min(0)
        total = p.sum(dims, keepdim=True)
        out[f"alti_{kind}"] = torch.where(total > 0, p / torch.where(total > 0, total, 1.0), 0.0)
    return out


def naive_alti_full(pattern, v, W_O, residual, b_O, position_mask=None, norm=None,
                    attn_norm=None):
    """ALTI (Ferrando et al. 2022) straight from its definition, in float64, one query at a
    time: ``(entries [b, h, q, k], residual share [b, q])``.

    Parts of query ``i``: every ``T(a_ij^h v~_j^h)`` and ``T(x_i)`` (``x = residual``);
    whole ``y_i = T(x_i + sum_{h,j} a_ij^h v~_j^h + b_O) + beta``. ``T`` is the identity
    (pre-LN) or, with ``norm = (gamma, beta, eps)``, the LayerNorm with its scale fixed
    at the whole's: ``T(u) = gamma (u - mean u) / sqrt(var(resid_mid_i) + eps)``.
    ``attn_norm = (gamma, eps)`` (Gemma-2/3): the RMSNorm ``N`` on the attention output
    ``attn_i = sum a v~ + b_O`` with its scale fixed at ``attn_i``'s; whole ``y_i = x_i +
    N(attn_i)``, parts ``gamma * a_ij^h v~_j^h / rms(attn_i)`` and ``x_i``.
    ``p = max(0, ||y||_1 - ||y - part||_1)`` normalised over all parts of the query.
    """
    a, v_tilde = _projected(pattern, v, W_O, position_mask)
    x, bias = residual.double(), b_O.double()
    b, h, q, k = a.shape
    start = k - q
    entries = torch.zeros(b, h, q, k, dtype=torch.float64)
    resid = torch.zeros(b, q, dtype=torch.float64)
    for bi in range(b):
        for i in range(q):
            parts = [a[bi, hh, i, j] * v_tilde[bi, hh, j] for hh in range(h) for j in range(k)]
            parts.append(x[bi, start + i])
            mid = sum(parts) + bias
            if attn_norm is not None:
                gamma, eps = attn_norm[0].double(), float(attn_norm[1])
                heads = parts[:-1]
                attn = sum(heads) + bias
                rms = torch.sqrt((attn**2).mean() + eps)
                whole = x[bi, start + i] + gamma * attn / rms
                parts = [gamma * u / rms for u in heads] + [x[bi, start + i]]
            elif norm is None:
                whole = mid
            else:
                gamma, beta, eps = (norm[0].double(), norm[1].double(), float(norm[2]))
                sigma = torch.sqrt(((mid - mid.mean()) ** 2).mean() + eps)

                def lin(u, gamma=gamma, sigma=sigma):
                    return gamma * (u - u.mean()) / sigma

                whole = lin(mid) + beta
                parts = [lin(u) for u in parts]
            p = torch.stack([(whole.abs().sum() - (whole - u).abs().sum()).clamp_min(0) for u in parts])
            if p.sum() > 0:
                p = p / p.sum()
            entries[bi, :, i] = p[:-1].view(h, k)
            resid[bi, i] = p[-1]
    return entries, resid


def random_layer(
    batch=2, n_heads=4, n_kv=2, pos=7, d_head=5, d_model=12, seed=0, dtype=torch.float32
):
    """A random causal pattern, values and W_O of consistent shapes."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, n_heads, pos, pos, generator=g, dtype=dtype)
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()
    pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    v = torch.randn(batch, pos, n_kv, d_head, generator=g, dtype=dtype)
    W_O = torch.randn(n_heads, d_head, d_model, generator=g, dtype=dtype)
    return pattern, v, W_O


# -- tiny seeded models of every architecture cwlens supports --------------------------
ARCHITECTURES = ("llama", "deepseek", "mistral", "qwen3", "gemma3", "gpt2", "bert")

_WORDS = (
    "the a an of to and in is was on for with as by at it he she they we you i cat dog "
    "sat mat ran fast slow big small red blue green house tree car paris france london "
    "england capital city when mary john went store gave bottle milk drink water one two "
    "three four five six seven eight nine ten"
).split()


def tiny_tokenizer(encoder: bool = False):
    """A word-level tokenizer built in memory (no download)."""
    # heavy: transformers, imported on use
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if encoder else ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + _WORDS + list(".,!?"))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials[1] if encoder else "<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if encoder:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
            sep_token="[SEP]", mask_token="[MASK]",
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>",
    )


def tiny_hf_model(arch: str, seed: int = 0):
    """``(hf_model, tokenizer)``: 2 layers, d_model 64, 4 heads of 16 (2 kv heads where GQA).

    Weights are the default init plus seeded noise, so biases and norm weights are not
    trivially 0/1 and bias or folding mistakes show up.
    """
    import transformers as T  # heavy: transformers, imported on use

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {ARCHITECTURES}; got {arch!r}")
    tok = tiny_tokenizer(encoder=arch == "bert")
    common: dict[str, Any] = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    configs: dict[str, Any] = {
        "llama": lambda: T.LlamaConfig(**common, head_dim=16),
        "deepseek": lambda: T.LlamaConfig(**{**common, "num_key_value_heads": 4}, head_dim=16),
        "mistral": lambda: T.MistralConfig(**common, head_dim=16, sliding_window=None),
        "qwen3": lambda: T.Qwen3Config(**common, head_dim=16),
        "gemma3": lambda: T.Gemma3TextConfig(
            **{**common, "tie_word_embeddings": True}, head_dim=16, sliding_window=8,
            query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"],
        ),
        "gpt2": lambda: T.GPT2Config(
            vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=128, n_ctx=128,  # type: ignore[call-arg]
            bos_token_id=1, eos_token_id=2, pad_token_id=0,
        ),
        "bert": lambda: T.BertConfig(
            vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=128, pad_token_id=0,
        ),
    }
    torch.manual_seed(seed)
    cfg = configs[arch]()
    if arch == "bert":
        hf = T.BertForMaskedLM(cfg)
    else:
        hf = T.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if not getattr(hf.config, "architectures", None):
        hf.config.architectures = [type(hf).__name__]
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return hf.eval(), tok


def save_tiny(arch: str, directory, seed: int = 0):
    """Write a tiny model as a Hugging Face directory (loadable by both TL generations)."""
    hf, tok = tiny_hf_model(arch, seed)
    path = Path(directory) / f"tiny-{arch.replace('llama', 'lm').replace('gemma', 'gm').replace('bert', 'enc')}"
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_model(arch: str, generation: Generation = "auto", seed: int = 0, directory=None):
    """A tiny seeded TransformerLens model: ``"bridge"`` (4.x) or ``"hooked"`` (3.x).

    Goes through a saved directory, as a user's local checkpoint would, so both
    generations load byte-identical weights. Without ``directory`` the files go to a
    temporary directory that is deleted once the model is in memory.
    """
    if directory is not None:
        path = save_tiny(arch, directory, seed)
        return load_model(str(path), device="cpu", generation=generation)
    with tempfile.TemporaryDirectory(prefix="cwlens-tiny-") as tmp:
        path = save_tiny(arch, tmp, seed)
        return load_model(str(path), device="cpu", generation=generation)


def synthetic_graph(n_layers: int = 30, n: int = 4096, top_k: int = 8, n_heads: int = 9,
                    seed: int = 0, metric: str = "contribution", compare: str | None = "attention",
                    ):
    """A synthetic ContributionGraph of any size (random edges of a causal graph), for the
    viewer's scale tests and scripts/benchmark_graph_page.py: a real 4,096-token build of
    SmolLM2 takes minutes on a CPU."""
    rng = np.random.default_rng(seed)
    K = top_k + 1
    pos = np.arange(n)
    frm = (rng.random((n_layers, n, K)) * (pos[None, :, None] + 1)).astype(np.int32)
    frm[:, :, 0] = pos[None, :]
    frm[:, pos < top_k, :] = np.where(np.arange(K)[None, None, :] <= pos[None, pos < top_k, None],
                                      frm[:, pos < top_k, :], -1)
    heads = (rng.standard_normal((n_layers, n, K, n_heads)) * 0.01).astype(np.float32)
    residual = rng.uniform(0.5, 1.0, (n_layers, n)).astype(np.float32)
    heads[frm < 0] = np.nan
    weight = heads.sum(-1)
    weight[:, :, 0] += residual
    order = np.argsort(-np.abs(np.nan_to_num(weight[:, :, 1:], nan=-1)), axis=-1)
    weight[:, :, 1:] = np.take_along_axis(weight[:, :, 1:], order, -1)
    frm[:, :, 1:] = np.take_along_axis(frm[:, :, 1:], order, -1)
    heads[:, :, 1:] = np.take_along_axis(heads[:, :, 1:], order[..., None], -2)
    share = np.full((n_layers, n, n_heads), 1.0 / n_heads, np.float32)
    factors = None
    factor_heads = None
    if metric == "contribution":
        factor_heads = np.argsort(-np.abs(np.nan_to_num(heads)), -1)[..., :3].astype(np.int16)
        factors = rng.uniform(0, 1, (*factor_heads.shape, 3)).astype(np.float32)
    other = None if compare is None else synthetic_graph(n_layers, n, top_k, n_heads, seed + 1, compare, None)
    words = ["the", " cat", " sat", " on", " a", " mat", ",", " and", " John", " Mary"]
    return ContributionGraph(
        tokens=tuple(words[i % len(words)] for i in range(n)), metric=metric,
        blocks=tuple(range(n_layers)), top_k=top_k, from_position=frm, weight=weight, heads=heads,
        residual=residual, attention=1 - residual, head_share=share, factor_heads=factor_heads,
        factors=factors, compare=other, model_name="synthetic")
