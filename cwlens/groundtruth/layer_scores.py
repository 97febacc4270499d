"""The model's scores at the ``layer`` and ``component`` levels (see
:mod:`cwlens.groundtruth.methods` for what each method is and what the output ``y`` is)."""

import torch

from cwlens.circuits import direct_math
from cwlens.circuits.patching import replace_heads_hook
from cwlens.core import metrics
from cwlens.engine import adapter, hook_names
from cwlens.engine.gradients import attention_gradient
from cwlens.engine.handle import ModelHandle
from cwlens.errors import InvalidArgumentError
from cwlens.groundtruth.methods import output_loss, outputs

# -- layer level ---------------------------------------------------------------------------
GEOMETRY_METRICS = {  # method -> (registry metric, kind)
    "attention": ("attention", "inter"),
    "value_weighted": ("value_weighted", "inter"),
    "value_weighted_output_normalized": ("value_weighted_output_normalized", "inter"),
    "contribution_intra": ("contribution", "intra"),
    "contribution": ("contribution", "inter"),
    "contribution_abs": ("contribution_abs", "inter"),
    "alti": ("alti", "inter"),
    "alti_attention": ("alti_attention", "inter"),
}


ZERO_OUTPUT = 1e-3  # ||o_i|| at most this times the layer's largest ||v~_j||: no output


def silent_rows(geo, kind: str, threshold: float = ZERO_OUTPUT) -> torch.Tensor:
    """``[batch, head or 1, query_pos]`` True where the attention output (the head's for
    ``"intra"``, the layer's for ``"inter"``) is numerically zero: ``||o_i|| <=``
    :data:`ZERO_OUTPUT` times the largest projected value norm of the layer. A query that
    fell back to a value-less BOS writes ``o_i = sum_j a_ij v~_j`` made only of the softmax's
    leak onto the other keys (in ``successor`` ``||o_i|| = 2.7e-7`` of a value of norm 1,
    where a query that moved something writes at least ``1 / n`` of a value): the
    output-normalised measures would share out that leak as if it were an output. cwlens
    sets a measure to 0 where ``||o_i|| = 0``
    (:meth:`~cwlens.core.AttentionGeometry.zero_output`); here the same holds where it is
    zero up to the leak. ``threshold`` replaces :data:`ZERO_OUTPUT` (0: only rows whose
    output is exactly zero, cwlens' own rule)."""
    scale = geo.value_norm.amax().double()
    return geo.output_norm(kind).double() <= threshold * scale


NORMALISED_BY = {"value_weighted_output_normalized": "inter", "contribution_intra": "intra",
                 "contribution": "inter", "contribution_abs": "inter", "alti_attention": "inter"}


def layer_scores(handle: ModelHandle, tokens: torch.Tensor, cache, answers: torch.Tensor,
                 zero_output: float = ZERO_OUTPUT) -> dict[str, torch.Tensor]:
    """``{method: [batch, layer, head_index, query_pos, key_pos]}`` float64 for every
    ``layer`` method, from ``cache`` (:func:`cwlens.circuits.run_with_cache` of ``tokens``)
    and one backward pass for the gradients. The methods normalised by the attention
    output (:data:`NORMALISED_BY`) are 0 in the rows where it is zero (:func:`silent_rows`
    with ``threshold=zero_output``)."""
    n_layers = handle.n_layers
    per: dict[str, list[torch.Tensor]] = {m: [] for m in GEOMETRY_METRICS}
    for layer in range(n_layers):
        geo = adapter.geometry(cache, handle, layer)
        silent = {kind: silent_rows(geo, kind, zero_output)[..., None].cpu() for kind in ("intra", "inter")}
        for method, (metric, kind) in GEOMETRY_METRICS.items():
            values = metrics.from_geometry(geo, metric, kind).double().cpu()
            if method in NORMALISED_BY:
                values = values.masked_fill(silent[NORMALISED_BY[method]], 0.0)
            per[method].append(values)
    out = {m: torch.stack(v, 1) for m, v in per.items()}
    grads = attention_gradient(handle, tokens, loss=output_loss(answers))
    signed = torch.stack([grads[ly].double().cpu() for ly in range(n_layers)], 1)
    out["attention_gradient"] = signed
    out["attention_gradient_abs"] = signed.abs()
    return out


# -- component level -----------------------------------------------------------------------
def _directions(handle: ModelHandle, answers: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``u'``: ``[batch, pos, d_model]`` the unembedding column of each position's output,
    read through the final norm's weight and centring where the model has a norm; and
    whether it has one."""
    W_U, _ = handle.unembed()
    u = W_U.to(torch.float64).T[answers.to(W_U.device)]
    weight, _, centres = handle.final_norm()
    if weight is not None:
        u = u * weight.to(torch.float64)
    if centres:
        u = u - u.mean(-1, keepdim=True)
    return u, weight is not None or centres


def component_scores(handle: ModelHandle, tokens: torch.Tensor, cache, answers: torch.Tensor,
                     corrupted: torch.Tensor, zero_output: float = ZERO_OUTPUT) -> dict[str, torch.Tensor]:
    """``{method: [batch, layer, head_index]}`` float64 for every ``component`` method.
    ``corrupted``: tokens of ``tokens``' shape whose ``hook_z`` patching reads."""
    b, n = tokens.shape
    queries = torch.arange(1, n)
    u, normed = _directions(handle, answers)
    scale_name = hook_names.final_scale()
    scale = (cache[scale_name][..., 0].double() if normed and scale_name in cache.keys()
             else torch.ones(b, n, dtype=torch.float64))
    off_bos, share, dla = [], [], []
    for layer in range(handle.n_layers):
        geo = adapter.geometry(cache, handle, layer)
        a = geo.attention().double()[:, :, 1:, :]  # [b, h, q >= 1, k]
        off_bos.append((1 - a[..., 0]).mean(-1))
        c = geo.contribution("inter").double().masked_fill(silent_rows(geo, "inter", zero_output)[..., None], 0.0)
        share.append(c[:, :, 1:, :].sum(-1).abs().mean(-1))
        terms = direct_math.head_key_terms(geo.pattern, geo.v, handle.W_O(layer),
                                           u[:, 1:].to(geo.pattern.device),
                                           scale[:, 1:].to(geo.pattern.device),
                                           queries.to(geo.pattern.device))  # [b, q, h, k]
        dla.append(terms.sum(-1).abs().mean(1))
    out = {"attention_off_bos": torch.stack(off_bos, 1).cpu(),
           "contribution_share": torch.stack(share, 1).cpu(),
           "direct_logit_attribution": torch.stack(dla, 1).double().cpu()}
    out["activation_patching"] = patching_effects(handle, tokens, corrupted, answers)
    return out


def patching_effects(handle: ModelHandle, tokens: torch.Tensor, corrupted: torch.Tensor,
                     answers: torch.Tensor) -> torch.Tensor:
    """``[batch, layer, head_index]``: per input, ``mean_{q >= 1} |y_q(clean) - y_q(patched)|``
    where head ``h``'s ``hook_z`` is taken from ``corrupted`` (one pass per layer, the
    batch repeated once per head, as :func:`cwlens.circuits.patch_heads` does, without its
    mean over the batch)."""
    if corrupted.shape != tokens.shape:
        raise InvalidArgumentError(
            f"corrupted tokens {list(corrupted.shape)} must have the clean tokens' shape "
            f"{list(tokens.shape)}: patching swaps activations position by position.")
    b = tokens.shape[0]
    names = {hook_names.z(ly) for ly in range(handle.n_layers)}
    with torch.no_grad():
        clean_logits = handle.model(tokens)
        clean = outputs(clean_logits, answers).double()
        _, cache = handle.cached_run(corrupted, names.__contains__)
        repeated = tokens.repeat(handle.n_heads, 1)
        rep_answers = answers.repeat(handle.n_heads, 1)
        effects = []
        for layer in range(handle.n_layers):
            hook = replace_heads_hook(cache[hook_names.z(layer)], b)
            with handle.hooks([(hook_names.z(layer), hook)]):
                patched = outputs(handle.model(repeated), rep_answers).double()
            delta = (patched.view(handle.n_heads, b, -1) - clean[None]).abs()[..., 1:]
            effects.append(delta.mean(-1).T.cpu())  # [b, head]
    return torch.stack(effects, 1)
