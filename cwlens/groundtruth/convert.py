"""Tracr's compiled transformers as cwlens models: :func:`from_tracr`, :func:`save`, :func:`load_weights`.

Tracr (Lindner et al. 2023, DeepMind, Apache-2.0) compiles a RASP program into the weights
of a transformer (``tracr.compiler.compiling.compile_rasp_to_model``) and runs it in
jax/haiku. :func:`from_tracr` copies those weights into a :class:`TracrTransformer`
(:mod:`cwlens.engine.models.tracr_network`), a small ``HookedRootModule`` with TransformerLens
3.x's hook names, and the same network, dimension for dimension: the residual stream's
axes are tracr's ``residual_labels`` (``tokens:x``, ``indices:3``, ``one``, the program's
own variables), every layer's residual equals tracr's ``apply(...).residuals`` and the
decoded outputs equal tracr's ``decoded``.

Why this route, on both TransformerLens generations:

- TransformerLens 4.x has only ``TransformerBridge``, which wraps a Hugging Face model.
  No Hugging Face architecture is tracr's: GPT-2's attention is causal (tracr's is
  bidirectional unless compiled ``causal=True``: ``reverse`` and ``sort`` read later
  positions), and its LayerNorms would have to be replaced by identities inside modules
  the bridge wraps; BERT is post-norm. A bridge over a patched model would be a second,
  unchecked copy of the network.
- On 3.x a ``HookedTransformer`` with ``normalization_type=None``, relu MLPs and learned
  positions (ACDC's conversion, ``acdc/tracr_task/utils.py``) holds the same weights, but
  it is a second route whose hook semantics would differ by generation.
- ``transformer_lens.HookedRootModule`` and ``HookPoint`` exist in both generations: one
  module, written here in ~200 lines that follow tracr's forward pass operation for
  operation, gives the same object, hooks and numbers on both, and cwlens measures it on
  its "hooked" path (``cwlens.engine.handle``: ``cfg``, ``run_with_cache``,
  ``run_with_hooks``, ``hooks()``, ``blocks[l].attn.W_O``, ``W_U``).

The weights need no jax once converted: :func:`save` writes them (``.npz``) with the
config and the layout (``.json``), :func:`load_weights` reads them back; the shipped
programs (:func:`cwlens.groundtruth.load`) are such files.
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.models.tracr_network import TracrConfig, TracrTransformer
from cwlens.errors import InvalidArgumentError, ModelNotAvailableError, UnsupportedModelError

FORMAT = "cwlens-tracr/1"
INSTALL = 'pip install "cwlens[tracr]"  (or: pip install tracr-pypi==1.0.0)'


@dataclass(frozen=True)
class TracrLayout:
    """What tracr's encoders and residual space say about a compiled model.

    Attributes:
        residual_labels: the name of every residual direction (``d_model`` of them, tracr's
            order): ``tokens:x``, ``indices:3``, ``one``, ``<variable>:<value>``,
            ``<numerical variable>``.
        input_tokens: the input vocabulary in token-id order (BOS and pad included).
        bos: the BOS token (tracr's ``compiler_bos``), at position 0 of every input.
        pad: tracr's pad token (``compiler_pad``).
        output_values: the categorical output's values in logit order; None for a
            numerical output (one logit: the value itself).
        output_name: the name of the program's output variable (its residual directions
            are ``output_name:value``, or ``output_name`` when numerical).
        max_seq_len: inputs hold at most this many tokens after the BOS.
        causal: whether tracr compiled the attention causal.
    """

    residual_labels: tuple[str, ...]
    input_tokens: tuple
    bos: str
    pad: str
    output_values: tuple | None
    output_name: str
    max_seq_len: int
    causal: bool = False

    @property
    def categorical(self) -> bool:
        return self.output_values is not None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "TracrLayout":
        outputs = data["output_values"]
        return cls(tuple(data["residual_labels"]), tuple(data["input_tokens"]), data["bos"],
                   data["pad"], None if outputs is None else tuple(outputs), data["output_name"],
                   int(data["max_seq_len"]), bool(data.get("causal", False)))


def require_tracr(what: str) -> Any:
    """Import tracr, or raise :class:`~cwlens.errors.ModelNotAvailableError` naming the extra."""
    try:
        import tracr.compiler.compiling as compiling  # optional: tracr (the tracr extra)
    except ImportError as err:
        raise ModelNotAvailableError(
            f"{what} needs tracr (and jax), which are not installed: {INSTALL}. The shipped "
            "programs load without it (cwlens.groundtruth.load(name)).") from err
    return compiling


def from_tracr(assembled: Any, name: str = "tracr", dtype: torch.dtype = torch.float32) -> TracrTransformer:
    """The cwlens model of a program tracr compiled.

    Args:
        assembled: tracr's ``AssembledTransformerModel`` (what
            ``tracr.compiler.compiling.compile_rasp_to_model`` returns).
        name: the model's name (``cfg.model_name``).
        dtype: the weights' dtype (tracr's are float32; float64 for checks).

    Returns:
        A ``TracrTransformer`` (:class:`~cwlens.engine.models.tracr_network.TracrTransformer`) that
        every cwlens function takes; ``model.layout`` (:class:`TracrLayout`) decodes its outputs
        (:func:`cwlens.groundtruth.decode`).

    Raises:
        InvalidArgumentError: ``assembled`` is not an assembled tracr model.
        UnsupportedModelError: a tracr model with LayerNorm (compiled models have none).

    Examples:
        >>> from tracr.compiler import compiling, lib  # doctest: +SKIP
        >>> from tracr.rasp import rasp  # doctest: +SKIP
        >>> assembled = compiling.compile_rasp_to_model(
        ...     lib.make_frac_prevs(rasp.tokens == "x"), vocab={"w", "x", "y"},
        ...     max_seq_len=5, compiler_bos="BOS")  # doctest: +SKIP
        >>> model = from_tracr(assembled, "frac_prevs")  # doctest: +SKIP
    """
    params, config = getattr(assembled, "params", None), getattr(assembled, "model_config", None)
    encoder = getattr(assembled, "input_encoder", None)
    if params is None or config is None or encoder is None or not hasattr(encoder, "encoding_map"):
        raise InvalidArgumentError(
            f"from_tracr takes tracr's assembled model (compile_rasp_to_model's result, with "
            f"params, model_config and input_encoder); got {type(assembled).__name__}. Compile "
            "the program first: tracr.compiler.compiling.compile_rasp_to_model(program, vocab, "
            "max_seq_len, compiler_bos='BOS').")
    if config.layer_norm:
        raise UnsupportedModelError(
            "this tracr model has LayerNorm (model_config.layer_norm=True); tracr's compiler "
            "never makes one and the conversion copies no norm: compile it with "
            "compile_rasp_to_model.")
    weights = _weights_of(assembled)
    layout = _layout_of(assembled, weights["W_U"])
    return build(weights, layout, name, dtype)


def _weights_of(assembled: Any) -> dict[str, np.ndarray]:
    """Tracr's parameters in TransformerLens' layout (``[head, d_model, d_head]`` ...)."""
    p = {k: {kk: np.asarray(vv, dtype=np.float32) for kk, vv in v.items()}
         for k, v in assembled.params.items()}
    cfg = assembled.model_config
    h, d = cfg.num_heads, cfg.key_size
    out = {"W_E": p["token_embed"]["embeddings"], "W_pos": p["pos_embed"]["embeddings"],
           "W_U": _unembedding(assembled, p["token_embed"]["embeddings"].shape[1])}
    for layer in range(cfg.num_layers):
        attn, mlp = f"transformer/layer_{layer}/attn", f"transformer/layer_{layer}/mlp"
        for ours, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
            w = p[f"{attn}/{theirs}"]["w"]  # [d_model, heads * d_head]
            out[f"{layer}.W_{ours}"] = w.reshape(w.shape[0], h, d).transpose(1, 0, 2)
            out[f"{layer}.b_{ours}"] = p[f"{attn}/{theirs}"]["b"].reshape(h, d)
        out[f"{layer}.W_O"] = p[f"{attn}/linear"]["w"].reshape(h, d, -1)
        out[f"{layer}.b_O"] = p[f"{attn}/linear"]["b"]
        out[f"{layer}.W_in"], out[f"{layer}.b_in"] = p[f"{mlp}/linear_1"]["w"], p[f"{mlp}/linear_1"]["b"]
        out[f"{layer}.W_out"], out[f"{layer}.b_out"] = p[f"{mlp}/linear_2"]["w"], p[f"{mlp}/linear_2"]["b"]
    return out


def _unembedding(assembled: Any, d_model: int) -> np.ndarray:
    """``W_U [d_model, n_outputs]``: tracr's unembedding (a projection onto the output
    space, which no parameter holds), read by running it on the identity."""
    import haiku as hk  # optional: tracr (the tracr extra)
    import jax.numpy as jnp

    def run(x: Any) -> Any:
        return assembled.get_compiled_model().unembed(x, use_unembed_argmax=False)

    unembed: Any = hk.without_apply_rng(hk.transform(run))
    w = np.asarray(unembed.apply(assembled.params, jnp.eye(d_model)), dtype=np.float32)
    return w.reshape(d_model, -1)


def _layout_of(assembled: Any, w_u: np.ndarray) -> TracrLayout:
    enc = assembled.input_encoder
    tokens = tuple(sorted(enc.encoding_map, key=enc.encoding_map.__getitem__))
    out = assembled.output_encoder
    outputs = None
    if out is not None and hasattr(out, "encoding_map"):
        outputs = tuple(sorted(out.encoding_map, key=out.encoding_map.__getitem__))
    labels = tuple(str(x) for x in assembled.residual_labels)
    n_outputs = w_u.shape[1]
    first = labels[int(np.argmax(w_u[:, 0]))]
    output_name = first if outputs is None else first[: -len(f":{outputs[0]}")]
    if outputs is not None and len(outputs) != n_outputs:
        raise UnsupportedModelError(
            f"tracr's output encoder has {len(outputs)} values but its unembedding "
            f"{n_outputs} directions: this assembled model is not one the compiler made.")
    max_len = enc._max_seq_len
    return TracrLayout(labels, tokens, str(enc.bos_token), str(enc.pad_token), outputs,
                       output_name, int(max_len) - 1, bool(assembled.model_config.causal))


def build(weights: dict[str, np.ndarray], layout: TracrLayout, name: str,
          dtype: torch.dtype = torch.float32) -> TracrTransformer:
    """A :class:`TracrTransformer` holding ``weights`` (the layout of :func:`_weights_of`)."""
    n_layers = 1 + max(int(k.split(".")[0]) for k in weights if k[0].isdigit())
    n_heads, d_model, d_head = weights["0.W_Q"].shape
    cfg = TracrConfig(
        n_layers=n_layers, n_heads=n_heads, d_head=d_head, d_model=d_model,
        d_mlp=weights["0.W_in"].shape[1], d_vocab=weights["W_E"].shape[0],
        d_vocab_out=weights["W_U"].shape[1], n_ctx=weights["W_pos"].shape[0],
        model_name=name, attention_dir="causal" if layout.causal else "bidirectional", dtype=dtype)
    model = TracrTransformer(cfg, layout)
    state = {"embed.W_E": weights["W_E"], "pos_embed.W_pos": weights["W_pos"],
             "unembed.W_U": weights["W_U"], "unembed.b_U": np.zeros(cfg.d_vocab_out, np.float32)}
    for layer in range(n_layers):
        for w in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O", "b_O"):
            state[f"blocks.{layer}.attn.{w}"] = weights[f"{layer}.{w}"]
        for w in ("W_in", "b_in", "W_out", "b_out"):
            state[f"blocks.{layer}.mlp.{w}"] = weights[f"{layer}.{w}"]
    model.load_state_dict({k: torch.from_numpy(np.array(v)).to(dtype) for k, v in state.items()})
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@takes_model
def weights_of(model: ModelLike) -> dict[str, np.ndarray]:
    """``model``'s weights as float32 arrays named as :func:`build` takes them."""
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.model.state_dict().items()}
    weights = {"W_E": sd["embed.W_E"], "W_pos": sd["pos_embed.W_pos"], "W_U": sd["unembed.W_U"]}
    for layer in range(model.n_layers):
        for w in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O", "b_O"):
            weights[f"{layer}.{w}"] = sd[f"blocks.{layer}.attn.{w}"]
        for w in ("W_in", "b_in", "W_out", "b_out"):
            weights[f"{layer}.{w}"] = sd[f"blocks.{layer}.mlp.{w}"]
    return weights


@takes_model
def save(model: ModelLike, path: str | Path) -> tuple[Path, Path]:
    """Write ``model``'s weights to ``path.npz`` and its config and layout to ``path.json``
    (:func:`load_weights` reads them back without jax)."""
    path = Path(path)
    npz, meta = path.with_suffix(".npz"), path.with_suffix(".json")
    arrays: dict[str, Any] = dict(weights_of(model))
    np.savez_compressed(npz, **arrays)
    meta.write_text(json.dumps({"format": FORMAT, "name": model.name,
                                "layout": model.model.layout.to_json()}, indent=1) + "\n")
    return npz, meta


def load_weights(path: str | Path, dtype: torch.dtype = torch.float32) -> TracrTransformer:
    """The model :func:`save` wrote to ``path`` (``path.npz`` + ``path.json``); no jax needed."""
    path = Path(path)
    npz, meta = path.with_suffix(".npz"), path.with_suffix(".json")
    for f in (npz, meta):
        if not f.is_file():
            raise ModelNotAvailableError(
                f"{f} is missing: a compiled program is two files, {npz.name} (the weights) and "
                f"{meta.name} (config and layout). Rebuild them with python "
                "scripts/compile_groundtruth.py (needs tracr).")
    data = json.loads(meta.read_text())
    if data.get("format") != FORMAT:
        raise InvalidArgumentError(
            f"{meta} has format {data.get('format')!r}, not {FORMAT!r}: rebuild it with python "
            "scripts/compile_groundtruth.py.")
    with np.load(npz) as z:
        weights = {k: z[k] for k in z.files}
    return build(weights, TracrLayout.from_json(data["layout"]), data["name"], dtype)
