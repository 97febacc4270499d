"""What cwlens.circuits reads from a TransformerLens model and cache (the adapter part).

The circuit tools assume a pre-norm decoder whose residual stream is the plain sum
``embedding + sum_l (attention_l + mlp_l)`` and whose logits are
``LN_final(x) W_U + b_U``. :func:`check_residual_model` refuses the others with a
message, rather than returning attributions that do not add up.
"""

from collections.abc import Callable

import torch

from cwlens import hook_names
from cwlens.adapter import ModelInfo
from cwlens.errors import UnsupportedModelError


def check_residual_model(model, what: str) -> ModelInfo:
    info = ModelInfo.of(model)
    cfg = model.cfg
    problems = []
    if info.post_attn_norm:
        problems.append("a norm after attention (Gemma-2/3) sits between the heads and the residual")
    if getattr(cfg, "parallel_attn_mlp", False):
        problems.append("attention and MLP run in parallel (no resid_mid)")
    if type(model).__name__ == "HookedEncoder" or "Bert" in str(getattr(cfg, "original_architecture", "")):
        problems.append("it is an encoder with post-norm residual blocks")
    if float(getattr(cfg, "output_logits_soft_cap", 0.0) or 0.0) > 0:
        problems.append("its logits are soft-capped (not linear in the residual)")
    if problems:
        raise UnsupportedModelError(
            f"{what} needs a pre-norm decoder whose residual stream is a plain sum of the "
            f"blocks' outputs, but for this model {'; '.join(problems)}. Use Llama-, "
            "Mistral-, Qwen- or GPT-2-style models (e.g. smollm2-135m, gpt2)."
        )
    return info


def check_residual_sum(cache, model, what: str, tolerance: float = 1e-3) -> None:
    """Check, per layer, that the residual stream is the plain sum the circuit tools assume:
    ``resid_mid - resid_pre = sum_h sum_j a_ij v~_j + b_O`` and ``next resid - resid_mid = mlp_out``
    (relative error ``<= tolerance``). A norm after attention or after the MLP (Gemma-2/3)
    or a post-norm block fails it."""
    from cwlens import adapter

    n = model.cfg.n_layers
    for layer in range(n):
        pre = adapter.read(cache, hook_names.resid_pre(layer), model).double()
        mid = adapter.read(cache, hook_names.resid_mid(layer), model).double()
        nxt = hook_names.resid_pre(layer + 1) if layer + 1 < n else hook_names.resid_post(layer)
        post = adapter.read(cache, nxt, model).double()
        heads = adapter.geometry(cache, model, layer).layer_output.double()
        attn = heads + adapter.b_O(model, layer).double().to(heads.device)
        mlp = adapter.read(cache, hook_names.mlp_out(layer), model).double()
        parts = (("attention", "the heads' a_ij v~_j + b_O", mid - pre, attn),
                 ("MLP", "hook_mlp_out", post - mid, mlp))
        for part, hook, added, rebuilt in parts:
            err = float((added - rebuilt).norm() / added.norm().clamp_min(1e-30))
            if err > tolerance:
                raise UnsupportedModelError(
                    f"{what}: in layer {layer}, what the {part} block added to the residual "
                    f"stream differs from {hook} "
                    f"by {err:.1e} (relative). It needs pre-norm residual blocks without a norm "
                    "after attention or MLP (Llama-, Mistral-, Qwen- or GPT-2-style models)."
                )


def circuit_names_filter(model) -> Callable[[str], bool]:
    """Hooks the circuit tools read: pattern and values of every layer, the residual
    stream before and after each attention, the MLP outputs and the final norm's scale."""
    n = model.cfg.n_layers
    keep = set(hook_names.needed(range(n)))
    for layer in range(n):
        keep |= {hook_names.resid_pre(layer), hook_names.resid_mid(layer), hook_names.mlp_out(layer)}
    keep |= {hook_names.resid_post(n - 1), hook_names.final_scale()}

    def names_filter(name: str) -> bool:
        return name in keep

    return names_filter


def run_with_cache(model, tokens: torch.Tensor):
    """``(logits, cache)`` with what :mod:`cwlens.circuits` needs (no gradients)."""
    with torch.no_grad():
        return model.run_with_cache(tokens, names_filter=circuit_names_filter(model))


def final_norm(model) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
    """``(weight, bias, centres)`` of the final norm: ``centres`` is True for LayerNorm
    (subtract the mean before scaling), False for RMSNorm. ``None`` = absent (folded)."""
    ln = model.ln_final
    weight = getattr(ln, "w", None)
    bias = getattr(ln, "b", None)
    norm_type = str(getattr(model.cfg, "normalization_type", "LN") or "")
    centres = not norm_type.startswith("RMS")
    weight = None if weight is None else weight.detach()
    bias = None if bias is None else bias.detach()
    return weight, bias, centres


def unembed(model) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_U [d_model, d_vocab], b_U [d_vocab])`` (zeros where the model has no b_U)."""
    W_U = model.W_U.detach()
    b_U = getattr(model, "b_U", None)
    b_U = torch.zeros(W_U.shape[1], dtype=W_U.dtype, device=W_U.device) if b_U is None else b_U.detach()
    return W_U, b_U
