"""The bound model handle: the one object that knows what a TransformerLens model is.

Users pass their model (``HookedTransformer``, ``HookedEncoder`` from 3.x,
``TransformerBridge`` from 4.x) to every cwlens function; cwlens turns it once into a
:class:`ModelHandle` (:func:`wrap`, called by :func:`cwlens.load_model` and cached on
the model) and asks the handle everything it needs: the shape, encoder or decoder, the
generation, tokenizing, adding hooks, W_O/b_O, the unembedding and final norm, and the
attention seam. Nothing else in cwlens reads ``model.cfg`` or the model's class name.

The handle reads the model's config on every question (nothing is frozen at wrap time),
so a config edited after wrapping is seen as it is.
"""

import math
import numbers
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from cwlens.core._types import ModelGeneration
from cwlens.engine import hook_names, pattern_seam
from cwlens.errors import InvalidArgumentError, UnsupportedModelError

_ATTRIBUTE = "_cwlens_handle"


@dataclass(frozen=True)
class ModelInfo:
    """The facts of a model that checks read (:attr:`ModelHandle.info`): a check takes these,
    not the model, so it can be run, and tested, without one."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    generation: ModelGeneration  # "bridge" (TransformerLens 4.x) or "hooked" (3.x)
    post_attn_norm: bool  # a norm between the heads and the residual sum (Gemma-2/3)
    is_encoder: bool  # bidirectional attention (ModelHandle.is_encoder)
    rotary: bool  # rotary positions: it runs past n_ctx (ModelHandle.rotary_positions)
    n_ctx: int | None  # the configured context (ModelHandle.context_length)
    name: str | None  # the config's model_name

    @classmethod
    def of(cls, model: Any) -> "ModelInfo":
        return wrap(model).info

    def hooks(self, layers: list[int], closure: bool = False) -> list[str]:
        return hook_names.needed(layers, closure, self.generation, self.post_attn_norm)


class ModelHandle:
    """Everything cwlens asks of one model. Made by :func:`wrap` (once per model)."""

    def __init__(self, model: Any):
        self.model: Any = model
        self.verified_edits: set[str] = set()  # hook kinds whose edits were seen to act

    def __repr__(self) -> str:
        return f"ModelHandle({self.class_name}, {self.n_layers} layers x {self.n_heads} heads)"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    # -- shape -----------------------------------------------------------------------
    @property
    def _cfg(self) -> Any:
        return self.model.cfg

    @property
    def info(self) -> ModelInfo:
        cfg = self._cfg
        n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        post = bool(getattr(cfg, "use_normalization_before_and_after", False)) or self._ln1_post
        return ModelInfo(cfg.n_layers, cfg.n_heads, n_kv, cfg.d_head, cfg.d_model,
                         self.generation, post, self.is_encoder, self.rotary_positions,
                         self.context_length(), self.name)

    @property
    def _ln1_post(self) -> bool:
        """Whether a block has a norm after attention, ``ln1_post``: TransformerLens 4.x
        names Gemma-2/3's ``post_attention_layernorm`` so (and leaves
        ``cfg.use_normalization_before_and_after`` False); 3.x's blocks name it the same."""
        return any(hasattr(block, "ln1_post") for block in getattr(self.model, "blocks", None) or ())

    @property
    def n_layers(self) -> int:
        return int(self._cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self._cfg.n_heads)

    @property
    def d_vocab(self) -> int:
        return int(self._cfg.d_vocab)

    @property
    def n_ctx(self) -> int:
        return int(self._cfg.n_ctx)

    @property
    def name(self) -> str | None:
        """The config's ``model_name`` (None where it has none)."""
        return getattr(self._cfg, "model_name", None)

    @property
    def device(self) -> Any:
        """The config's device, or ``"cpu"``."""
        return getattr(self._cfg, "device", None) or "cpu"

    @property
    def class_name(self) -> str:
        return type(self.model).__name__

    @property
    def generation(self) -> ModelGeneration:
        return "bridge" if self.class_name == "TransformerBridge" else "hooked"

    @property
    def is_encoder(self) -> bool:
        """Bidirectional attention (BERT-like): ``HookedEncoder`` or a bridge with
        ``attention_dir``. The one place cwlens decides "encoder"."""
        if self.class_name == "HookedEncoder":
            return True
        return getattr(self._cfg, "attention_dir", "causal") == "bidirectional"

    def attention_window(self, layer: int) -> int | None:
        """The sliding-window size of ``layer`` (query ``i`` sees keys ``i - w < j <= i``),
        or None where the layer attends to the whole context.

        TransformerLens 4.x: ``cfg.layer_types`` (``"sliding_attention"``) with the window
        from ``cfg.sliding_window`` or the wrapped Hugging Face config; 3.x:
        ``cfg.attn_types`` (``"local"``) with ``cfg.window_size``.
        """
        cfg = self._cfg
        hf_cfg = getattr(getattr(self.model, "original_model", None), "config", None)
        layer_types = getattr(cfg, "layer_types", None) or getattr(hf_cfg, "layer_types", None)
        if layer_types is not None:
            if layer_types[layer] != "sliding_attention":
                return None
            window = getattr(cfg, "sliding_window", None) or getattr(hf_cfg, "sliding_window", None)
            return None if window is None else int(window)
        attn_types = getattr(cfg, "attn_types", None)
        if getattr(cfg, "use_local_attn", False) and attn_types is not None:
            return int(cfg.window_size) if attn_types[layer] == "local" else None
        return None

    def value_heads(self) -> set[int]:
        """How many value heads a cache of this model may hold per layer: the kv heads,
        and also one per query head where TransformerLens 3.x ungroups GQA
        (``cfg.ungroup_grouped_query_attention``)."""
        info = self.info
        ungrouped = bool(getattr(self._cfg, "ungroup_grouped_query_attention", False))
        return {info.n_kv_heads, info.n_heads} if ungrouped else {info.n_kv_heads}

    @property
    def normalized(self) -> bool:
        """Whether the model normalises its residual stream at all: False for a config with
        ``normalization_type=None`` (tracr's compiled transformers, :mod:`cwlens.groundtruth`:
        no norm anywhere, so a bidirectional one is no post-norm encoder)."""
        return getattr(self._cfg, "normalization_type", "LN") is not None

    def residual_problems(self) -> list[str]:
        """Why the residual stream is not the plain sum of the blocks' outputs that the
        circuit tools assume (empty for a pre-norm decoder)."""
        cfg = self._cfg
        problems = []
        if self.info.post_attn_norm:
            problems.append("a norm after attention (Gemma-2/3) sits between the heads and the residual")
        if getattr(cfg, "parallel_attn_mlp", False):
            problems.append("attention and MLP run in parallel (no resid_mid)")
        if (self.is_encoder or "Bert" in str(getattr(cfg, "original_architecture", ""))) and self.normalized:
            problems.append("it is an encoder with post-norm residual blocks")
        if float(getattr(cfg, "output_logits_soft_cap", 0.0) or 0.0) > 0:
            problems.append("its logits are soft-capped (not linear in the residual)")
        return problems

    # -- running -----------------------------------------------------------------------
    def forward_kwargs(self, attention_mask: torch.Tensor | None) -> dict[str, Any]:
        """The keyword that passes ``attention_mask`` to this model's forward (or nothing).

        TransformerLens 3.x's ``HookedEncoder`` names it ``one_zero_attention_mask``.
        """
        if attention_mask is None:
            return {}
        key = "one_zero_attention_mask" if self.class_name == "HookedEncoder" else "attention_mask"
        return {key: attention_mask}

    def cached_run(self, input: Any, names_filter: Any, **kwargs: Any) -> Any:
        """``(logits, cache)`` from the model's own ``run_with_cache``."""
        return self.model.run_with_cache(input, names_filter=names_filter, **kwargs)

    def run_with_hooks(self, tokens: torch.Tensor, fwd_hooks: list, **kwargs: Any) -> Any:
        return self.model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, **kwargs)

    def has_hook(self, name: str) -> bool:
        """Whether the model has a hook point called ``name`` (aliases included)."""
        try:
            return name in self.model.hook_dict
        except AttributeError:
            return False

    def context_length(self) -> int | None:
        """The context length the model was configured with (``cfg.n_ctx``), or None."""
        n_ctx = getattr(self._cfg, "n_ctx", None)
        return int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None

    def vocab_size(self) -> int | None:
        """The number of token ids the embedding holds (``cfg.d_vocab``), or None."""
        n = getattr(self._cfg, "d_vocab", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    @property
    def rotary_positions(self) -> bool:
        """Whether positions are rotary (RoPE: Llama, Mistral, Qwen, Gemma; the model runs
        past ``context_length``), not learned absolute embeddings (GPT-2, BERT; no
        position exists past ``context_length``)."""
        return getattr(self._cfg, "positional_embedding_type", None) == "rotary"

    @property
    def supports_blockwise(self) -> bool:
        """Whether attention can run in query blocks
        (:func:`cwlens.engine.models.blockwise.blockwise_attention`): TransformerLens 4.x
        bridges, which hold the Hugging Face model they wrap."""
        return getattr(self.model, "original_model", None) is not None and hasattr(self.model, "blocks")

    def post_attention_norm(self, layer: int) -> tuple[str, Any, Any, Any]:
        """``(class name, weight, bias, eps)`` of block ``layer``'s ``ln1`` (the
        post-attention LayerNorm of a BERT-like encoder); None where one is absent."""
        ln = self.model.blocks[layer].ln1
        weight = getattr(ln, "w", None)
        if weight is None:
            weight = getattr(ln, "weight", None)
        bias = getattr(ln, "b", None)
        if bias is None:
            bias = getattr(ln, "bias", None)
        eps = getattr(ln, "eps", None) or getattr(ln, "variance_epsilon", None) or getattr(self._cfg, "eps", None)
        return type(ln).__name__, weight, bias, eps

    def attention_output_norm(self, layer: int) -> tuple[torch.Tensor, float]:
        """``(gamma [d_model], eps)`` of the RMSNorm block ``layer`` applies to its attention
        output before the residual sum (``ln1_post``: Gemma-2/3's
        ``post_attention_layernorm``).

        ``gamma`` is the effective scale, read by probing the module rather than from its
        weight (Hugging Face's Gemma norms scale by ``1 + weight``, TransformerLens 3.x
        folds the 1 into ``w``): ``gamma = N(1) * sqrt(1 + eps)``, then ``N(u) = gamma * u
        / sqrt(mean(u^2) + eps)`` is checked on a random ``u``. Raises
        :class:`~cwlens.errors.UnsupportedModelError` where there is no such norm or it
        is not an RMSNorm of that form."""
        block = self.model.blocks[layer]
        ln = getattr(block, "ln1_post", None)
        if ln is None:
            raise UnsupportedModelError(
                f"layer {layer} has no post-attention norm (blocks.{layer}.ln1_post); this model "
                "adds the attention output to the residual stream as it is.")
        module = getattr(ln, "original_component", None) or getattr(ln, "_original_component", None) or ln
        eps = next((float(e) for e in (getattr(module, "eps", None), getattr(module, "variance_epsilon", None),
                                       getattr(ln, "eps", None), getattr(self._cfg, "eps", None))
                    if e is not None), None)
        param = next(module.parameters(), None)
        if eps is None or param is None:
            raise UnsupportedModelError(
                f"alti: cannot read the post-attention norm of layer {layer} ({type(module).__name__} "
                "has no eps or no weight). Use metric 'alti_attention' instead.")
        d = param.shape[-1]
        with torch.no_grad():
            ones = torch.ones(1, 1, d, dtype=param.dtype, device=param.device)
            gamma = module(ones)[0, 0].double() * math.sqrt(1 + eps)
            g = torch.Generator().manual_seed(0)
            u = torch.randn(1, 2, d, generator=g, dtype=torch.float64)
            expect = gamma.cpu() * u / (u.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            got = module(u.to(device=param.device, dtype=param.dtype)).double().cpu()
        tol = 1e-6 if param.dtype in (torch.float32, torch.float64) else 2e-2
        if not torch.allclose(got, expect, rtol=tol, atol=tol * float(expect.abs().max())):
            raise UnsupportedModelError(
                f"alti: the post-attention norm of layer {layer} ({type(module).__name__}) is not "
                "an RMSNorm gamma * u / sqrt(mean(u^2) + eps), the form cwlens linearises. Use "
                "metric 'alti_attention' instead.")
        return gamma.to(param.dtype), eps

    @contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[str, Any]]) -> Iterator[Any]:
        """The model's own ``hooks`` context: adds ``fwd_hooks`` and removes exactly
        those on exit (also on exceptions); hooks already on the model stay."""
        with self.model.hooks(fwd_hooks=list(fwd_hooks)):
            yield self.model

    def n_hooks(self) -> int:
        """How many forward hooks are attached to the model's hook points (0 when clean)."""
        return sum(len(getattr(hp, "fwd_hooks", [])) for hp in self.model.hook_dict.values())

    def enable_pattern_edits(self) -> None:
        """Route delegating bridge attentions through the pattern seam
        (:mod:`cwlens.engine.pattern_seam`), so ``hook_pattern`` edits act."""
        pattern_seam.enable_pattern_edits(self.model)

    # -- tokenizing --------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def pad_id(self) -> int:
        """The id a batch is padded with: the tokenizer's pad token, else its
        end-of-sequence token, else 0."""
        tok = self.tokenizer
        pad_id = getattr(tok, "pad_token_id", None)
        return int(pad_id if pad_id is not None else getattr(tok, "eos_token_id", None) or 0)

    @property
    def padding_side(self) -> str:
        """``"right"`` for encoders, ``"left"`` for decoders (the last token of every row real)."""
        return "right" if self.is_encoder else "left"

    def chat_prompt(self, user: str) -> str:
        """``user`` as one user turn of the tokenizer's chat template, followed by the
        assistant header (``add_generation_prompt``): the text an instruction-tuned model
        answers. Raises :class:`~cwlens.errors.UnsupportedModelError` if the tokenizer has
        no chat template."""
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            raise UnsupportedModelError(
                f"{self.name or self.class_name}'s tokenizer has no chat template, so chat "
                "prompts cannot be built: use the plain lm-eval prompts (prompt='plain', "
                "CLI --prompt plain), or a model with a chat template (an -Instruct model).")
        return str(tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                           add_generation_prompt=True))

    def to_tokens(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model.to_tokens(*args, **kwargs)

    def token_ids(self, text: str, truncate: bool = True, prepend_bos: bool = True) -> torch.Tensor:
        """1-D token ids of one text, as the model itself makes them (on the CPU). Decoders
        cut the text at the context length (``n_ctx``) unless ``truncate=False`` (texts
        longer than the model was trained on); encoders never cut it here.
        ``prepend_bos=False``: without the BOS token TransformerLens prepends by default."""
        if self.is_encoder and prepend_bos:  # [CLS] ... [SEP] (to_tokens differs by version)
            return torch.tensor(self.tokenizer(text)["input_ids"])
        # to_tokens' own defaults are not passed (models and stubs whose to_tokens lacks
        # the keywords still work)
        extra = ({} if truncate else {"truncate": False}) | ({} if prepend_bos else {"prepend_bos": False})
        return self.to_tokens(text, move_to_device=False, **extra)[0].cpu()

    def n_tokens(self, input: Any) -> int:
        """The length of ``input`` in tokens: token ids (their last axis), a text, or the
        longest of a list of texts (not cut at the context, as the forward pass is not:
        :func:`cwlens.engine.validation.run_input`)."""
        if isinstance(input, torch.Tensor):
            return int(input.shape[-1])
        texts = [input] if isinstance(input, str) else input
        return max((len(self.token_ids(t, truncate=False)) for t in texts), default=0)

    def to_str_tokens(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.to_str_tokens(*args, **kwargs)

    # -- weights -----------------------------------------------------------------------
    def W_O(self, layer: int) -> torch.Tensor:
        """``[head_index, d_head, d_model]`` output projection of one layer (detached)."""
        return self.model.blocks[layer].attn.W_O.detach()

    def b_O(self, layer: int) -> torch.Tensor:
        """``[d_model]`` output bias of one layer (zeros where the model has none)."""
        try:
            bias = self.model.blocks[layer].attn.b_O
        except AttributeError:
            bias = None
        if bias is None:
            w = self.W_O(layer)
            return torch.zeros(w.shape[-1], dtype=w.dtype, device=w.device)
        return bias.detach()

    def unembed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W_U [d_model, d_vocab], b_U [d_vocab])`` (zeros where the model has no b_U)."""
        W_U = self.model.W_U.detach()
        b_U = getattr(self.model, "b_U", None)
        b_U = torch.zeros(W_U.shape[1], dtype=W_U.dtype, device=W_U.device) if b_U is None else b_U.detach()
        return W_U, b_U

    def final_norm(self) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
        """``(weight, bias, centres)`` of the final norm: ``centres`` is True for LayerNorm
        (subtract the mean before scaling), False for RMSNorm. ``None`` = absent (folded)."""
        ln = self.model.ln_final
        weight = getattr(ln, "w", None)
        bias = getattr(ln, "b", None)
        centres = self.normalized and not str(getattr(self._cfg, "normalization_type", "LN")).startswith("RMS")
        weight = None if weight is None else weight.detach()
        bias = None if bias is None else bias.detach()
        return weight, bias, centres

    @contextmanager
    def unembedding_skipped(self) -> Iterator[list[torch.Tensor]]:
        """Inside, the model's unembedding makes no logits: it is handed zero positions
        of its input, so a forward returns ``[batch, 0, d_vocab]`` "logits" and no
        ``[batch, pos, d_vocab]`` tensor is made. The input it was given (the final
        residual after the final norm, ``[batch, pos, d_model]``) is appended to the
        yielded list; :meth:`logits_of` turns it into the logits the forward returns.

        A forward pre-hook on the unembedding module (``model.unembed``, which both
        TransformerLens generations call on the final residual), removed on exit."""
        caught: list[torch.Tensor] = []

        def skip(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                caught.append(args[0])
                return (args[0][..., :0, :], *args[1:]), kwargs
            key = next(iter(kwargs))
            caught.append(kwargs[key])
            return args, {**kwargs, key: kwargs[key][..., :0, :]}

        hook = self.model.unembed.register_forward_pre_hook(skip, with_kwargs=True)
        try:
            yield caught
        finally:
            hook.remove()

    def logits_of(self, residual: torch.Tensor) -> torch.Tensor:
        """The logits of a final residual ``[..., d_model]`` (the unembedding's input,
        :meth:`unembedding_skipped`) as the model's forward makes them: the model's own
        unembedding (its ``W_U`` and ``b_U``), then what the model applies after it:
        TransformerLens 4.x: the architecture's output transform (Gemma's logit soft cap
        ``cap * tanh(x / cap)``, Granite's or Cohere's scaling); 3.x: the soft cap of
        ``cfg.output_logits_soft_cap`` where it is > 0."""
        logits = self.model.unembed(residual)
        transform = getattr(getattr(self.model, "adapter", None), "apply_output_logits_transform", None)
        if transform is not None:
            return transform(logits)
        cap = float(getattr(self._cfg, "output_logits_soft_cap", 0.0) or 0.0)
        return cap * torch.tanh(logits / cap) if cap > 0 else logits

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


def wrap(model: Any) -> ModelHandle:
    """The :class:`ModelHandle` of ``model`` (made once, then cached on the model).

    Every cwlens function takes the TransformerLens model itself and asks its handle what
    it needs; :func:`cwlens.load_model` wraps the models it loads, and a model you built
    yourself is wrapped on first use (or here).

    Args:
        model: a TransformerLens model (``HookedTransformer``, ``HookedEncoder``,
            ``TransformerBridge``), or a handle (returned as it is).

    Returns:
        The model's :class:`ModelHandle`: the same object on every call.

    Raises:
        InvalidArgumentError: something that is not a model (:func:`model_problem`: no
            ``cfg`` with positive integer ``n_layers``, ``n_heads``, ``d_model``,
            ``d_head``, or no hooks API), naming what was passed (a tokenizer, a
            configuration, a Hugging Face module, a cache, a model name) and what to pass.

    Examples:
        >>> import cwlens
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> handle = cwlens.wrap(model)
        >>> handle.n_layers, handle.n_heads, handle.is_encoder
        (2, 4, False)
        >>> cwlens.wrap(model) is handle
        True
    """
    if isinstance(model, ModelHandle):
        return model
    handle = getattr(model, "__dict__", {}).get(_ATTRIBUTE)
    if handle is None:
        _require_model(model)
        handle = ModelHandle(model)
        try:  # past nn.Module.__setattr__: the handle is no submodule, parameter or buffer
            object.__setattr__(model, _ATTRIBUTE, handle)
        except (AttributeError, TypeError):
            pass  # no instance dict (slots): an uncached handle answers the same
    return handle


SHAPE_FIELDS = ("n_layers", "n_heads", "d_model", "d_head")  # what every measure reads off cfg
HOOK_METHODS = ("run_with_hooks", "hooks")  # how cwlens reads and edits activations


def model_problem(model: Any) -> str | None:
    """Why ``model`` is not something cwlens can measure (None: it is).

    A model is judged by what it has, not by its class: a ``cfg`` with positive integers
    ``n_layers``, ``n_heads``, ``d_model`` and ``d_head``, and TransformerLens' hooks API
    (``run_with_hooks`` and ``hooks``). ``HookedTransformer``, ``HookedEncoder``,
    ``TransformerBridge`` and any ``HookedRootModule`` built like them (e.g. a tracr-compiled
    model, :mod:`cwlens.groundtruth`) have both.
    """
    kind = type(model).__name__
    if model is None:
        return "got None"
    if isinstance(model, str | bytes | os.PathLike):
        return (f"got the {kind} {str(model)[:80]!r}: a model name or path is loaded first, "
                "model = cwlens.load_model(name)")
    if kind == "ActivationCache":
        return "got the ActivationCache (arguments swapped? the order is (cache, model))"
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        if callable(getattr(model, "encode", None)) and callable(getattr(model, "decode", None)):
            return f"got a tokenizer ({kind}): pass the model itself, not model.tokenizer"
        if all(hasattr(model, f) for f in SHAPE_FIELDS) or (
                hasattr(model, "to_dict") and hasattr(model, "model_type")):
            return (f"got a configuration ({kind}), not a model: pass the model itself (not "
                    "its cfg or config), or load one with cwlens.load_model(name or folder)")

        if isinstance(model, torch.nn.Module):
            return (f"got a torch module without a TransformerLens cfg ({kind}): a Hugging Face "
                    "model loads through cwlens.load_model(name or folder)")
        return f"got {kind}, which has no cfg"
    missing = [f for f in SHAPE_FIELDS
               if not isinstance(getattr(cfg, f, None), numbers.Integral)
               or isinstance(getattr(cfg, f), bool) or getattr(cfg, f) < 1]
    if missing:
        return (f"got {kind} whose cfg ({type(cfg).__name__}) has no positive integer "
                f"{', '.join(missing)}")
    no_hooks = [m for m in HOOK_METHODS if not callable(getattr(model, m, None))]
    if no_hooks:
        return (f"got {kind}, which lacks TransformerLens' hooks API ({', '.join(no_hooks)}): "
                "cwlens reads the activations through hook points")
    return None


def _require_model(model: Any) -> None:
    """Refuse, naming what was passed and what is expected, anything that is not a model
    (:func:`model_problem`): a cache or text where the model goes, a tokenizer, a
    configuration, a Hugging Face module, a model name not yet loaded."""
    problem = model_problem(model)
    if problem is None:
        return

    raise InvalidArgumentError(
        "expected a TransformerLens model (HookedTransformer, HookedEncoder, TransformerBridge, "
        "or an object with a cfg holding n_layers, n_heads, d_model, d_head and the hooks API "
        f"run_with_hooks/hooks), e.g. model = cwlens.load_model(name); {problem}.")


def unwrap(model: Any) -> Any:
    """The model itself, given the model or its handle."""
    return model.model if isinstance(model, ModelHandle) else model
