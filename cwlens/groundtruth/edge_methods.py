"""Every method's weight of each edge ``(layer, head, key)`` at one query, shaped like
:attr:`EdgeEffects.effect <cwlens.groundtruth.edges.EdgeEffects.effect>`, to be scored
against the true effects.

- ``attention`` ``a_ij``; ``value_weighted`` ``a_ij ||v~_j||`` (Kobayashi et al. 2020);
  ``value_weighted_output_normalized`` ``a_ij ||v~_j|| / ||o_i||``; ``contribution``
  ``<o_i, a_ij v~_j> / ||o_i||^2`` (the layer's output, inter-head) and
  ``contribution_intra`` (the head's own output); ``alti`` (Ferrando et al. 2022): the
  geometry metrics of :data:`cwlens.core.metrics.REGISTRY`, computed on the same run.
- ``attention_gradient``: ``a_ij dy/da_ij`` with ``y`` the objective at the query: the
  first-order estimate of the very effect measured (``a_ij dy/da_ij = <dy/dz_i^h, a_ij
  v_j>``, the objective's linear change when the edge's term leaves ``z_i^h``). It is 0 for
  ``kl`` and ``embedding`` (the divergence's and the damage's gradients vanish at the clean
  point): NaN there.
- ``direct_logit_attribution``: ``<a_ij v~_j, u'> / s_i``, the edge's direct effect on the
  objective's logit direction ``u`` (the target's unembedding column; ``a``'s minus
  ``b``'s for ``logit_diff``) read through the final norm frozen at its clean scale ``s_i``
  (:mod:`cwlens.circuits.direct_math`). NaN for ``kl`` and ``embedding`` (no single
  direction).
"""

from collections.abc import Sequence

import torch

from cwlens.circuits import direct_math
from cwlens.core import metrics
from cwlens.engine import adapter, hook_names
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.gradients import attention_gradient
from cwlens.engine.handle import ModelHandle
from cwlens.errors import UnknownOptionError
from cwlens.groundtruth.edges import UNSIGNED, EdgeEffects, Reader, handle_in
from cwlens.groundtruth.layer_scores import GEOMETRY_METRICS

GEOMETRY = {m: GEOMETRY_METRICS[m] for m in (  # method -> (registry metric, kind)
    "attention", "value_weighted", "value_weighted_output_normalized", "contribution",
    "contribution_intra", "alti")}
EDGE_METHODS: tuple[str, ...] = (*GEOMETRY, "attention_gradient", "direct_logit_attribution")
LABELS = {"attention": "attention", "value_weighted": "value-weighted",
          "value_weighted_output_normalized": "vw output-norm.", "contribution": "contribution (inter)",
          "contribution_intra": "contribution (intra)", "alti": "ALTI",
          "attention_gradient": "attn x grad", "direct_logit_attribution": "edge DLA"}


def check_methods(methods: Sequence[str]) -> tuple[str, ...]:
    unknown = [m for m in methods if m not in EDGE_METHODS]
    if unknown:
        raise UnknownOptionError(
            f"Unknown edge method {unknown[0]!r}. Valid: {', '.join(EDGE_METHODS)}.")
    return tuple(methods)


@takes_model
def method_weights(model: ModelLike, fx: EdgeEffects, methods: Sequence[str] = EDGE_METHODS) -> dict[str, torch.Tensor]:
    """``{method: [layer, head, key]}`` float64 on the CPU for the input, query, layers and
    objective of ``fx`` (the model in ``fx.dtype``, as the effects were measured)."""
    methods = check_methods(methods)
    handle = handle_in(model, fx.dtype)
    tokens = fx.tokens[None].to(handle.device)
    q = fx.query
    names = set(handle.info.hooks(fx.layers)) | {hook_names.final_scale()}
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        _, cache = handle.cached_run(tokens, names.__contains__)
        for method in methods:
            if method in GEOMETRY:
                metric, kind = GEOMETRY[method]
                out[method] = torch.stack([
                    metrics.from_geometry(adapter.geometry(cache, handle, ly), metric, kind)[0, :, q, :]
                    .double().cpu() for ly in fx.layers])
    if "attention_gradient" in methods:
        out["attention_gradient"] = _attention_gradient(handle, tokens, fx)
    if "direct_logit_attribution" in methods:
        out["direct_logit_attribution"] = _dla(handle, cache, fx)
    return {m: out[m] for m in methods}


def _attention_gradient(handle: ModelHandle, tokens: torch.Tensor, fx: EdgeEffects) -> torch.Tensor:
    if fx.objective in UNSIGNED:
        return torch.full_like(fx.effect, float("nan"))
    reader = Reader(fx.objective, fx.target)
    q = fx.query
    grads = attention_gradient(handle, tokens, layers=fx.layers,
                               loss=lambda logits: -reader(logits[:, q]).sum())
    return torch.stack([grads[ly][0, :, q, :].double().cpu() for ly in fx.layers])


def _dla(handle: ModelHandle, cache, fx: EdgeEffects) -> torch.Tensor:
    if fx.objective in UNSIGNED:
        return torch.full_like(fx.effect, float("nan"))
    W_U, _ = handle.unembed()
    if fx.objective == "logit_diff":  # logprob, nll, logit: the target's own column
        answers, foils = torch.tensor([[fx.target[0]]]), torch.tensor([[fx.target[1]]])
    else:
        answers, foils = torch.tensor([[int(fx.target)]]), None
    w_ln, _, centres = handle.final_norm()
    if foils is None:  # the target's own logit (the mean logit is not subtracted here)
        W = W_U.to(torch.float64)
        u = W.T[answers.to(W.device)]
        u_eff = u if w_ln is None else u * w_ln.to(torch.float64)
        if centres:
            u_eff = u_eff - u_eff.mean(-1, keepdim=True)
    else:
        _, u_eff = direct_math.effective_directions(W_U, answers.to(W_U.device), foils.to(W_U.device),
                                                    w_ln, centres)
    name = hook_names.final_scale()
    q = torch.tensor([fx.query])
    scale = (cache[name][..., 0][:, q].double() if name in cache.keys()
             else torch.ones(1, 1, dtype=torch.float64))
    rows = []
    for ly in fx.layers:
        pattern = adapter.read(cache, hook_names.pattern(ly), handle)
        v = adapter.read(cache, hook_names.values(ly), handle)
        terms = direct_math.head_key_terms(pattern, v, handle.W_O(ly), u_eff.to(pattern.device),
                                           scale.to(pattern.device), q.to(pattern.device))
        rows.append(terms[0, 0].double().cpu())  # [head, key]
    return torch.stack(rows)
