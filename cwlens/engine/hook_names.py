"""Every TransformerLens hook name cwlens uses is built here, and only here.

The names are the same on ``HookedTransformer`` (TransformerLens 3.x) and
``TransformerBridge`` (4.x).
"""

from collections.abc import Callable, Iterable

from cwlens.core._types import ModelGeneration


def pattern(layer: int) -> str:
    """Attention probabilities ``[batch, head_index, query_pos, key_pos]``."""
    return f"blocks.{layer}.attn.hook_pattern"


def values(layer: int) -> str:
    """Value vectors ``[batch, key_pos, kv_head, d_head]`` (b_V included)."""
    return f"blocks.{layer}.attn.hook_v"


def z(layer: int) -> str:
    """Per-head mixed values ``[batch, query_pos, head_index, d_head]``."""
    return f"blocks.{layer}.attn.hook_z"


def attn_out(layer: int) -> str:
    """The attention block's output in the residual stream ``[batch, pos, d_model]`` (b_O included)."""
    return f"blocks.{layer}.hook_attn_out"


def o_proj_out(layer: int) -> str:
    """TransformerBridge: the output projection's own output (b_O included), before any
    post-attention norm (Gemma-3) or residual LayerNorm (BERT) that ``hook_attn_out`` sees."""
    return f"blocks.{layer}.attn.o.hook_out"


def closure_target(layer: int, generation: ModelGeneration, post_attn_norm: bool = False) -> str:
    """The hook that holds what the attention heads wrote, to check the weights against.

    TransformerBridge: :func:`o_proj_out`. HookedTransformer: :func:`attn_out`, or
    :func:`z` where a norm sits between the heads and ``hook_attn_out`` (Gemma-2/3).
    """
    if generation == "bridge":
        return o_proj_out(layer)
    return z(layer) if post_attn_norm else attn_out(layer)


def needed(
    layers: Iterable[int], closure: bool = False, generation: ModelGeneration = "bridge",
    post_attn_norm: bool = False,
) -> list[str]:
    """The hooks cwlens reads for these layers (``closure`` adds :func:`closure_target`):
    the pattern, the values and the residual stream entering the layer (ALTI's residual
    part; ``[batch, pos, d_model]``, small next to the pattern)."""
    names = []
    for layer in layers:
        names += [pattern(layer), values(layer), resid_pre(layer)]
        if closure:
            names.append(closure_target(layer, generation, post_attn_norm))
    return names


def names_filter_for(
    layers: Iterable[int], closure: bool = False, extra: Iterable[str] = (), **kw
) -> Callable[[str], bool]:
    """A ``names_filter`` for ``run_with_cache`` that keeps just :func:`needed` (and
    the hook names in ``extra``)."""
    return NamesFilter(frozenset(needed(layers, closure, **kw)).union(extra))


class NamesFilter:
    """A ``names_filter``: called with a hook name, True for the hooks it keeps;
    ``names`` is the set, and it prints them (``<built-in method __contains__ of
    frozenset>`` said nothing)."""

    def __init__(self, names: frozenset[str]):
        self.names = names

    def __call__(self, name: str) -> bool:
        return name in self.names

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        names = sorted(self.names, key=_hook_order)
        shown = ", ".join(names[:4]) + (f", ... ({len(names) - 4} more)" if len(names) > 4 else "")
        return f"names_filter({len(names)} hooks: {shown}; .names lists them)"


def _hook_order(name: str) -> tuple:
    """Hook names in the model's order: block number first (``blocks.10`` after ``blocks.9``)."""
    parts = name.split(".")
    return (int(parts[1]) if parts[0] == "blocks" and parts[1].isdigit() else 10**9, name)



# -- the residual stream and the final norm (used by cwlens.circuits) --------------------
def resid_pre(layer: int) -> str:
    """The residual stream entering block ``layer`` ``[batch, pos, d_model]``."""
    return f"blocks.{layer}.hook_resid_pre"


def resid_mid(layer: int) -> str:
    """The residual stream after block ``layer``'s attention, before its MLP."""
    return f"blocks.{layer}.hook_resid_mid"


def resid_post(layer: int) -> str:
    """The residual stream leaving block ``layer``."""
    return f"blocks.{layer}.hook_resid_post"


def mlp_out(layer: int) -> str:
    """What block ``layer``'s MLP writes into the residual stream."""
    return f"blocks.{layer}.hook_mlp_out"


def final_scale() -> str:
    """The final norm's scale ``[batch, pos, 1]`` (RMS, or the standard deviation for
    LayerNorm): ``ln_final.hook_normalized = centred(x) / scale``."""
    return "ln_final.hook_scale"
