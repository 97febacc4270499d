"""Where attention goes versus what it carries, by token class (Kobayashi et al., 2020).

Kobayashi et al. ("Attention is not only a weight", EMNLP 2020) found that BERT puts
much attention on [CLS], [SEP] and punctuation but that those tokens' norm-weighted
contributions ``||a_ij v~_j||`` are small: the attention is a no-op. This module measures
that split on any model cwlens reads, through the factor split of the contribution::

    c_ij = a_ij * (||v~_j|| / ||o_i||) * cos(o_i, v~_j)

Token classes (:data:`CLASSES`, :func:`token_classes`): ``cls`` (the tokenizer's
``cls_token_id``; a model without one, a decoder, uses its first real token, the BOS
when the tokenizer adds one), ``sep`` (``sep_token_id``, else ``eos_token_id``),
``punctuation`` (the token decodes, stripped of whitespace and a leading ``##``, to a
non-empty string of Unicode punctuation, categories ``P*``) and ``other``.

For one layer, head ``h``, real query ``i`` and class ``C`` (every sum over the query's
eligible keys ``j``: every real key in an encoder, the real keys ``j <= i`` in a
decoder)::

    attention       A_C = sum_{j in C} a_ij                                  (mass received)
    norm_weighted   N_C = sum_{j in C} ||a_ij v~_j|| / sum_j ||a_ij v~_j||   (Kobayashi)
    contribution    intra: sum_{j in C} c_ij^h          (sums to 1 over keys for each head)
                    inter: sum_h sum_{j in C} c_ij^h    (the class's share of the layer
                           output o_i; sums to 1 over heads and keys)
    contribution_abs  the same shares of |c|: sum_{j in C} |c| / sum_j |c| per head (intra),
                    sum_{h, j in C} |c| / sum_{h, j} |c| per query (inter)
    key_frac        |{j in C}| / |{j}|         (the share under uniform attention)

The inter contribution is summed over heads, as :func:`cwlens.sinks.statistics.layer_summary`
sums ``sink_contribution_inter`` into the sink token's share of the layer: one head's
inter weights sum to that head's (signed, possibly tiny) share of ``o_i``, so a per-head
ratio would divide by numbers near 0. Each column is a mean over every (sample, query)
row, and over heads except for the inter contribution, pooled over all texts (every row
weighs the same, whatever the batching). The factor columns ``mean_attention``,
``mean_relative_norm`` and ``mean_cosine`` are means over the (head, query, key-in-class)
entries. In a decoder the first real query is left out (it can only attend to itself, as
in :mod:`cwlens.sinks`). Every class share sums to 1 over the classes (every real key
has exactly one class).
"""

import unicodedata
from collections.abc import Sequence

import pandas as pd
import torch

from cwlens.core._types import Kind
from cwlens.core.geometry import AttentionGeometry, check_kind, safe_divide
from cwlens.engine.batching import context_cap, pad_batch, token_ids
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.streaming import stream_geometry
from cwlens.errors import EmptyInputError, InvalidArgumentError

CLASSES = ("cls", "sep", "punctuation", "other")
CLS, SEP, PUNCT, OTHER = range(4)
LABELS = {"cls": "[CLS]", "sep": "[SEP]", "punctuation": "punctuation", "other": "other"}
SHARES = ("attention", "norm_weighted", "contribution", "contribution_abs")
FACTORS = ("mean_attention", "mean_relative_norm", "mean_cosine")
COLUMNS = ("layer", "token_class", "n_keys", "key_frac", *SHARES, *FACTORS)


def is_punctuation(piece: str) -> bool:
    """True for a non-empty string (whitespace and a leading ``##`` stripped) of Unicode
    punctuation only (categories ``P*``)."""
    s = piece.strip()
    if s.startswith("##"):
        s = s[2:].strip()
    return bool(s) and all(unicodedata.category(ch).startswith("P") for ch in s)


@takes_model
def token_classes(model: ModelLike, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[batch, pos]`` long: the index in :data:`CLASSES` of every token, -1 on padding.

    ``cls``: the tokenizer's ``cls_token_id``; a tokenizer without one (a decoder) marks
    the first real token of each row instead (the BOS where the tokenizer prepends one).
    ``sep``: ``sep_token_id``, or ``eos_token_id`` when there is no sep token.
    ``punctuation``: tokens whose decoded text, stripped of whitespace and ``##``, is
    all Unicode punctuation. ``other``: the rest.
    """
    tokens = tokens if tokens.ndim == 2 else tokens[None]
    real = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.to(tokens.device).bool()
    if real.shape != tokens.shape:
        raise InvalidArgumentError(
            f"mask has shape {tuple(real.shape)} but tokens {tuple(tokens.shape)}: pass the "
            "attention mask from cwlens.engine.batching.pad_batch with its tokens."
        )
    tok = model.tokenizer
    out = torch.full_like(tokens, OTHER)
    pieces: dict[int, bool] = {}
    for t in torch.unique(tokens[real]).tolist():
        pieces[t] = is_punctuation(tok.decode([t]))
    punct_ids = [t for t, p in pieces.items() if p]
    if punct_ids:
        out[torch.isin(tokens, torch.tensor(punct_ids, device=tokens.device))] = PUNCT
    sep_id = getattr(tok, "sep_token_id", None)
    if sep_id is None:
        sep_id = getattr(tok, "eos_token_id", None)
    if sep_id is not None:
        out[tokens == sep_id] = SEP
    cls_id = getattr(tok, "cls_token_id", None)
    if cls_id is not None:
        out[tokens == cls_id] = CLS
    else:  # the first real token of each row (argmax of a bool row: its first True)
        first = real.long().argmax(-1)
        out[torch.arange(len(tokens), device=tokens.device), first] = CLS
    return out.masked_fill(~real, -1)


class _Sums:
    """Running sums (numerators and counts) of one layer's columns, over batches."""

    def __init__(self) -> None:
        self.num: dict[str, torch.Tensor] = {}
        self.den: dict[str, torch.Tensor] = {}

    def add(self, name: str, num: torch.Tensor, den: torch.Tensor) -> None:
        num, den = num.double().cpu(), den.double().cpu()
        if name in self.num:
            self.num[name] += num
            self.den[name] += den
        else:
            self.num[name], self.den[name] = num, den


def layer_sums(geo: AttentionGeometry, classes: torch.Tensor, causal: bool,
               kind: Kind = "inter") -> _Sums:
    """The numerators and counts of every column of one layer (one batch), see the module
    docstring. ``classes`` from :func:`token_classes` (-1 on padding)."""
    check_kind(kind)
    dev, dt = geo.pattern.device, geo.pattern.dtype
    classes = classes.to(dev)
    real = classes >= 0  # [b, k]
    onehot = torch.nn.functional.one_hot(classes.clamp_min(0), len(CLASSES)).to(dt)
    onehot = onehot * real[..., None].to(dt)  # [b, k, C]
    b, h, q, k = geo.pattern.shape
    eligible = real[:, :, None] & real[:, None, :]  # [b, q, k]
    queries = real.clone()
    if causal:
        eligible &= torch.ones(q, k, dtype=torch.bool, device=dev).tril()
        first = real.long().argmax(-1)
        queries[torch.arange(b, device=dev), first] = False
    qm = queries.to(dt)  # [b, q]
    n_rows = qm.sum() * h
    s = _Sums()

    def share(weights: torch.Tensor) -> torch.Tensor:
        """Per head and query: the class sums over the total, ``[b, h, q, C]``."""
        return safe_divide(weights @ onehot[:, None], weights.sum(-1, keepdim=True))

    def over_rows(x: torch.Tensor) -> torch.Tensor:  # [b, h, q, C] -> [C]
        return torch.einsum("bhqc,bq->c", x, qm)

    a = geo.attention()
    s.add("attention", over_rows(a @ onehot[:, None]), n_rows.expand(len(CLASSES)))
    s.add("norm_weighted", over_rows(share(geo.value_weighted())), n_rows.expand(len(CLASSES)))
    c = geo.contribution(kind)
    if kind == "intra":
        s.add("contribution", over_rows(c @ onehot[:, None]), n_rows.expand(len(CLASSES)))
        s.add("contribution_abs", over_rows(share(c.abs())), n_rows.expand(len(CLASSES)))
    else:  # shares of the layer output: summed over heads, one row per query
        per_query = (c @ onehot[:, None]).sum(1)  # [b, q, C]
        n_q = qm.sum().expand(len(CLASSES))
        s.add("contribution", torch.einsum("bqc,bq->c", per_query, qm), n_q)
        ab = c.abs()
        abs_share = safe_divide((ab @ onehot[:, None]).sum(1), ab.sum((1, 3))[..., None])
        s.add("contribution_abs", torch.einsum("bqc,bq->c", abs_share, qm), n_q)
    # uniform baseline: the class's fraction of each query's eligible keys
    el = eligible.to(dt)
    frac = safe_divide(el @ onehot, el.sum(-1, keepdim=True))  # [b, q, C]
    s.add("key_frac", torch.einsum("bqc,bq->c", frac, qm), qm.sum().expand(len(CLASSES)))
    # factor means over (head, query, key-in-class) entries
    entries = (qm[:, :, None] * el)[..., None] * onehot[:, None]  # [b, q, k, C]
    n_entries = entries.sum((0, 1, 2)) * h
    for name, x in (("mean_attention", a), ("mean_relative_norm", geo.relative_norm(kind)),
                    ("mean_cosine", geo.cosine(kind))):
        s.add(name, torch.einsum("bhqk,bqkc->c", x, entries), n_entries)
    s.add("n_keys", onehot.sum((0, 1)), torch.ones(len(CLASSES)))
    return s


def _texts(texts) -> list[str]:
    """The strings of ``texts`` (strings or (id, text) pairs); anything else is refused: a
    bare string was split into characters, a tensor analysed as the text "tensor([...])"."""
    if isinstance(texts, str | bytes) or not isinstance(texts, Sequence):
        raise InvalidArgumentError(
            f"texts must be a list of strings or (id, text) pairs; got {type(texts).__name__}"
            + (": a single text: pass [text]" if isinstance(texts, str) else "") + ".")
    out = [t[1] if isinstance(t, (tuple, list)) and len(t) == 2 else t for t in texts]
    if not out:
        raise EmptyInputError("No texts: pass at least one text (or (id, text) pair).")
    for t in out:
        if not isinstance(t, str) or not t.strip():
            raise InvalidArgumentError(
                f"texts must hold non-empty strings or (id, text) pairs; got {t!r}.")
    return out


@takes_model
def class_shares(model: ModelLike, texts: Sequence, max_tokens: int = 128, batch_size: int = 16,
                 kind: Kind = "inter") -> pd.DataFrame:
    """One row per (layer, token class): the columns of the module docstring (:data:`COLUMNS`).

    ``texts``: strings or ``(id, text)`` pairs (as :func:`cwlens.faithfulness.encoder.sentences`
    gives). Each text is cut to its first ``max_tokens`` tokens; batches of ``batch_size``
    (padded as :func:`cwlens.engine.batching.pad_batch` does) run through the streaming engine, so
    no layer's pattern outlives its layer. ``kind`` is the projection of the contribution
    and of the relative norm and cosine (``||o_i||``: the layer output for ``"inter"``, the
    head's own for ``"intra"``).
    """
    check_kind(kind)
    for name, value in (("max_tokens", max_tokens), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{name} must be a positive integer; got {value!r}.")
    strings = _texts(texts)
    full = [token_ids(model, t, truncate=False) for t in strings]
    cap = context_cap(model.info, max_tokens, [len(r) for r in full])
    rows = sorted((r[:cap] for r in full), key=len)
    causal = not model.is_encoder
    totals: dict[int, _Sums] = {}
    for start in range(0, len(rows), batch_size):
        tokens, mask = pad_batch(model, rows[start : start + batch_size])
        classes = token_classes(model, tokens, mask)

        def one_layer(ly: int, geo: AttentionGeometry, cl: torch.Tensor = classes) -> tuple[int, _Sums]:
            return ly, layer_sums(geo, cl, causal, kind)

        with torch.no_grad():
            _, per_layer = stream_geometry(model, tokens, one_layer, attention_mask=mask)
        for ly, sums in per_layer:
            if ly not in totals:
                totals[ly] = sums
            else:
                for name in sums.num:
                    totals[ly].add(name, sums.num[name], sums.den[name])
    out = []
    for ly in sorted(totals):
        t = totals[ly]
        for ci, name in enumerate(CLASSES):
            row: dict = {"layer": ly, "token_class": name, "n_keys": int(t.num["n_keys"][ci])}
            for col in ("key_frac", *SHARES, *FACTORS):
                den = float(t.den[col][ci])
                row[col] = float(t.num[col][ci]) / den if den > 0 else float("nan")
            out.append(row)
    return pd.DataFrame(out, columns=list(COLUMNS))


def summary(df: pd.DataFrame) -> dict:
    """Per class, the means over layers of every share and factor column, and per layer
    the shares: ``{"classes": {class: {column: mean}}, "layers": {class: {column: [per layer]}}}``."""
    cols = ("key_frac", *SHARES, *FACTORS)
    out: dict = {"classes": {}, "layers": {}, "n_layers": int(df["layer"].nunique())}
    for name in CLASSES:
        part = df[df["token_class"] == name].sort_values("layer")
        out["classes"][name] = {c: float(part[c].mean()) for c in cols}
        out["classes"][name]["n_keys"] = int(part["n_keys"].iloc[0]) if len(part) else 0
        out["layers"][name] = {c: [float(x) for x in part[c]] for c in cols}
    return out


def format_summary(d: dict) -> str:
    """A few lines a reader reads: per class, attention vs norm-weighted share (means over
    layers) and the factors, against the ``other`` tokens."""
    other = d["classes"]["other"]
    lines = [f"means over {d['n_layers']} layers (share of each query's row; uniform = key_frac)"]
    for name in CLASSES:
        c = d["classes"][name]
        if c["n_keys"] == 0:
            lines.append(f"{LABELS[name]}: no tokens of this class")
            continue
        ratio = c["attention"] / c["norm_weighted"] if c["norm_weighted"] > 0 else float("inf")
        how = f"{ratio:.1f}x less" if ratio >= 1 else f"{1 / ratio:.1f}x more"
        lines.append(
            f"{LABELS[name]}: attention {c['attention']:.3f} of each row vs norm-weighted "
            f"{c['norm_weighted']:.3f} ({how}), |contribution| {c['contribution_abs']:.3f}, "
            f"signed {c['contribution']:+.3f}; uniform {c['key_frac']:.3f} ({c['n_keys']} key positions)"
        )
        if name != "other":
            lines.append(
                f"    per key: attention {c['mean_attention']:.3f} vs {other['mean_attention']:.3f}, "
                f"relative norm {c['mean_relative_norm']:.2f} vs {other['mean_relative_norm']:.2f}, "
                f"cosine {c['mean_cosine']:+.3f} vs {other['mean_cosine']:+.3f} for other tokens"
            )
    return "\n".join(lines)
