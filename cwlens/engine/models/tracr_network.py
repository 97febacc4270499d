"""The torch network a tracr program runs as: :class:`TracrTransformer`.

A small :class:`transformer_lens.HookedRootModule` with TransformerLens 3.x's hook names
and weight layout, so that cwlens measures it on its "hooked" path on both TransformerLens
generations (:func:`cwlens.groundtruth.from_tracr` says why this route). The forward pass
is tracr's (``tracr/transformer/model.py``, ``attention.py``), operation for operation::

    x_0   = W_E[token] + W_pos[position]              (one-hot: token, position, "one")
    x    += sum_h softmax(q_h k_h^T / sqrt(d_head)) v_h W_O[h] + b_O    (every query sees
                                                        every key unless tracr compiled causal)
    x    += relu(x W_in + b_in) W_out + b_out
    logits = x W_U                                     (W_U: the output space's directions)

No normalisation anywhere: ``ln_final`` is the identity (its ``hook_scale`` is 1, so
cwlens' direct logit attribution reads the residual as it is).

Shapes use TransformerLens' names: ``W_Q/W_K/W_V [head_index, d_model, d_head]``,
``W_O [head_index, d_head, d_model]``, ``hook_v [batch, key_pos, head_index, d_head]``,
``hook_pattern [batch, head_index, query_pos, key_pos]``.
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from cwlens.errors import InputTooLongError, InvalidArgumentError, ShapeMismatchError

MASKED = -1e30  # the logit tracr gives a masked key (jnp.where(mask, logits, -1e30))


@dataclass
class TracrConfig:
    """What cwlens (and TransformerLens' helpers) read off ``model.cfg``."""

    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    d_mlp: int
    d_vocab: int  # input tokens (BOS, pad and the program's vocabulary)
    d_vocab_out: int  # output directions (1 for a numerical output)
    n_ctx: int  # max_seq_len + 1 (the BOS)
    model_name: str = "tracr"
    attention_dir: str = "bidirectional"  # "causal" where tracr compiled causal=True
    act_fn: str = "relu"
    normalization_type: str | None = None
    positional_embedding_type: str = "standard"
    original_architecture: str = "tracr"
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    n_key_value_heads: int | None = None
    default_prepend_bos: bool = True
    tokenizer_prepends_bos: bool = True
    extra: dict = field(default_factory=dict)


class TracrTokenizer:
    """A word-level tokenizer over the program's input tokens, enough of Hugging Face's
    interface for cwlens: a text is its tokens separated by spaces (``"BOS a b c"``); a
    text that does not start with the BOS gets one."""

    padding_side = "right"
    cls_token_id = None
    sep_token_id = None
    eos_token_id = None
    chat_template = None

    def __init__(self, tokens: tuple, bos: str, pad: str):
        self.tokens = tuple(tokens)
        self.bos_token, self.pad_token = bos, pad
        self._ids: dict[Any, int] = {}
        for i, token in enumerate(self.tokens):
            self._ids[token] = i
        for i, token in enumerate(self.tokens):  # "1" finds the token 1 (texts are strings)
            self._ids.setdefault(str(token), i)
        self.bos_token_id = self._ids[bos]
        self.pad_token_id = self._ids[pad]

    def __len__(self) -> int:
        return len(self.tokens)

    def id_of(self, token: Any) -> int:
        """The id of one token (a vocabulary value, or its string)."""
        if isinstance(token, bool) or token not in self._ids:
            key = str(token)
            if key in self._ids and not isinstance(token, bool):
                return self._ids[key]
            shown = [t for t in self.tokens if t != self.pad_token]
            raise InvalidArgumentError(
                f"token {token!r} is not in this program's vocabulary {shown}: pass tokens "
                f"of the vocabulary (the first one {self.bos_token!r}).")
        return self._ids[token]

    def tokenize(self, text: str) -> list[str]:
        words = text.split()
        return words if words[:1] == [self.bos_token] else [self.bos_token, *words]

    def encode(self, text: str, **_: Any) -> list[int]:
        return [self.id_of(w) for w in self.tokenize(text)]

    def __call__(self, text: str, **_: Any) -> dict[str, list[int]]:
        ids = self.encode(text)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def convert_ids_to_tokens(self, ids: Any) -> list[str]:
        return [str(self.tokens[int(i)]) for i in ids]

    def decode(self, ids: Any, **_: Any) -> str:
        return " ".join(self.convert_ids_to_tokens(torch.as_tensor(ids).reshape(-1).tolist()))


class Embed(nn.Module):
    def __init__(self, cfg: TracrConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.zeros(cfg.d_vocab, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    def __init__(self, cfg: TracrConfig):
        super().__init__()
        self.W_pos = nn.Parameter(torch.zeros(cfg.n_ctx, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.W_pos[: tokens.shape[-1]].expand(tokens.shape[0], -1, -1)


class Attention(nn.Module):
    def __init__(self, cfg: TracrConfig):
        super().__init__()
        self.cfg = cfg
        h, m, d = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.zeros(h, m, d, dtype=cfg.dtype))
        self.W_K = nn.Parameter(torch.zeros(h, m, d, dtype=cfg.dtype))
        self.W_V = nn.Parameter(torch.zeros(h, m, d, dtype=cfg.dtype))
        self.b_Q = nn.Parameter(torch.zeros(h, d, dtype=cfg.dtype))
        self.b_K = nn.Parameter(torch.zeros(h, d, dtype=cfg.dtype))
        self.b_V = nn.Parameter(torch.zeros(h, d, dtype=cfg.dtype))
        self.W_O = nn.Parameter(torch.zeros(h, d, m, dtype=cfg.dtype))
        self.b_O = nn.Parameter(torch.zeros(m, dtype=cfg.dtype))
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern, self.hook_z = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        q = self.hook_q(torch.einsum("bpm,hmd->bphd", x, self.W_Q) + self.b_Q)
        k = self.hook_k(torch.einsum("bpm,hmd->bphd", x, self.W_K) + self.b_K)
        v = self.hook_v(torch.einsum("bpm,hmd->bphd", x, self.W_V) + self.b_V)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / (self.cfg.d_head ** 0.5)
        n = x.shape[1]
        allowed = torch.ones(n, n, dtype=torch.bool, device=x.device)
        if self.cfg.attention_dir == "causal":
            allowed = allowed.tril()
        allowed = allowed[None, None]
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, :]
        scores = self.hook_attn_scores(scores.masked_fill(~allowed, MASKED))
        pattern = self.hook_pattern(scores.softmax(-1))
        z = self.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern, v))
        return torch.einsum("bqhd,hdm->bqm", z, self.W_O) + self.b_O


class MLP(nn.Module):
    def __init__(self, cfg: TracrConfig):
        super().__init__()
        self.W_in = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_mlp, dtype=cfg.dtype))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp, dtype=cfg.dtype))
        self.W_out = nn.Parameter(torch.zeros(cfg.d_mlp, cfg.d_model, dtype=cfg.dtype))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        return self.hook_post(torch.relu(pre)) @ self.W_out + self.b_out


class Block(nn.Module):
    def __init__(self, cfg: TracrConfig):
        super().__init__()
        self.attn, self.mlp = Attention(cfg), MLP(cfg)
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint(), HookPoint()
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(x, key_mask)))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(x)))


class IdentityNorm(nn.Module):
    """Tracr has no final norm: this passes the residual on and says its scale is 1."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.hook_scale(torch.ones_like(x[..., :1]))
        return self.hook_normalized(x)


class Unembed(nn.Module):
    def __init__(self, cfg: TracrConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_vocab_out, dtype=cfg.dtype))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab_out, dtype=cfg.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.W_U + self.b_U


class TracrTransformer(HookedRootModule):
    """A compiled tracr program as a TransformerLens-style model (see the module docstring).

    Made by :func:`cwlens.groundtruth.from_tracr` (from tracr's assembled model) or
    :func:`cwlens.groundtruth.load` (a shipped program); ``layout`` holds what tracr's
    encoders know (the input tokens, the output values, the residual directions' names).
    """

    def __init__(self, cfg: TracrConfig, layout: Any):
        super().__init__()
        self.cfg, self.layout = cfg, layout
        self.tokenizer = TracrTokenizer(layout.input_tokens, layout.bos, layout.pad)
        self.embed, self.pos_embed = Embed(cfg), PosEmbed(cfg)
        self.hook_embed, self.hook_pos_embed = HookPoint(), HookPoint()
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_final, self.unembed = IdentityNorm(), Unembed(cfg)
        self.setup()

    def __repr__(self) -> str:
        c = self.cfg
        return (f"TracrTransformer({c.model_name!r}: {c.n_layers} layers x {c.n_heads} heads, "
                f"d_model {c.d_model}, {c.d_vocab} input tokens, {c.d_vocab_out} outputs)")

    def to(self, *args: Any, **kwargs: Any) -> "TracrTransformer":
        """``nn.Module.to``, keeping ``cfg.device`` and ``cfg.dtype`` (which cwlens reads)
        in step with the weights."""
        out = super().to(*args, **kwargs)
        self.cfg.device, self.cfg.dtype = str(self.W_E.device), self.W_E.dtype
        return out

    @property
    def W_U(self) -> torch.Tensor:
        return self.unembed.W_U

    @property
    def b_U(self) -> torch.Tensor:
        return self.unembed.b_U

    @property
    def W_E(self) -> torch.Tensor:
        return self.embed.W_E

    @property
    def W_pos(self) -> torch.Tensor:
        return self.pos_embed.W_pos

    def forward(self, input: Any, return_type: str | None = "logits",
                attention_mask: torch.Tensor | None = None, **_: Any) -> torch.Tensor | None:
        """Logits ``[batch, pos, d_vocab_out]`` (``return_type=None``: nothing) of token ids
        ``[batch, pos]`` (or ``[pos]``), a text ``"BOS a b"`` or a list of texts.
        ``attention_mask`` ``[batch, pos]`` (0 = padding) hides padding keys, as tracr's
        own pad mask does."""
        tokens = self.to_tokens(input) if not isinstance(input, torch.Tensor) else input
        if tokens.ndim == 1:
            tokens = tokens[None]
        tokens = tokens.to(self.W_E.device)
        if tokens.shape[-1] > self.cfg.n_ctx:
            raise InputTooLongError(
                f"the input has {tokens.shape[-1]} tokens with its BOS, more than this program's "
                f"{self.cfg.n_ctx} (max_seq_len {self.cfg.n_ctx - 1} + the BOS): pass at most "
                f"{self.cfg.n_ctx - 1} tokens after the BOS.")
        key_mask = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != tuple(tokens.shape):
                raise ShapeMismatchError(
                    f"attention_mask is {tuple(attention_mask.shape)}, the tokens "
                    f"{tuple(tokens.shape)}: pass one 0/1 entry per token.")
            key_mask = attention_mask.to(tokens.device).bool()
        x = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(self.pos_embed(tokens))
        for block in self.blocks:
            x = block(x, key_mask)
        logits = self.unembed(self.ln_final(x))
        return None if return_type is None else logits

    def run_with_cache(self, *model_args: Any, **kwargs: Any) -> tuple[Any, ActivationCache]:
        """``(logits, ActivationCache)``, as :class:`~transformer_lens.HookedTransformer` gives."""
        out, cache = super().run_with_cache(*model_args, **kwargs)
        return out, ActivationCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    def to_tokens(self, input: Any, prepend_bos: Any = None, padding_side: Any = None,
                  move_to_device: bool = True, truncate: bool = True) -> torch.Tensor:
        """``[batch, pos]`` token ids of a text ``"BOS a b"`` (the BOS is added when missing)
        or a list of texts of one length (texts of several lengths:
        :func:`cwlens.engine.batching.pad_batch`)."""
        texts = [input] if isinstance(input, str) else list(input)
        if not all(isinstance(t, str) for t in texts):
            raise InvalidArgumentError(
                f"to_tokens takes a text (tokens separated by spaces) or a list of texts; got "
                f"{type(input).__name__}. For a list of tokens use cwlens.groundtruth.encode.")
        ids = [self.tokenizer.encode(t) for t in texts]
        if len({len(i) for i in ids}) > 1:
            raise ShapeMismatchError(
                f"the texts have {sorted({len(i) for i in ids})} tokens: to_tokens stacks texts "
                "of one length; pad them with cwlens.engine.batching.pad_batch(model, texts).")
        tokens = torch.tensor(ids, dtype=torch.long)
        return tokens.to(self.W_E.device) if move_to_device else tokens

    def to_str_tokens(self, input: Any, prepend_bos: Any = None) -> list[str]:
        tokens = self.to_tokens(input) if isinstance(input, str) else torch.as_tensor(input)
        return self.tokenizer.convert_ids_to_tokens(tokens.reshape(-1).tolist())
