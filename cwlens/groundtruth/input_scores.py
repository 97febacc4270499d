"""The model's scores at the ``input`` level: ``[batch, query_pos, key_pos]``, how much
the output at each position owes to each input token (see
:mod:`cwlens.groundtruth.methods` for each method and for the output ``y``).

The captum attributions are taken with respect to the residual stream entering layer 0
(``blocks.0.hook_resid_pre``: the token plus position embedding), replaced by captum's
input tensor in the forward pass; one output position at a time (``target=q``).
"""

import torch

from cwlens.circuits import flow_math
from cwlens.core.rollout import rollout
from cwlens.engine import adapter, hook_names
from cwlens.engine.handle import ModelHandle
from cwlens.errors import ModelNotAvailableError
from cwlens.groundtruth.methods import IG_STEPS, outputs
from cwlens.groundtruth.padding import padding_heads, without_padding

FLOW_RULES = ("projection", "signed", "absolute")


def require_captum():
    try:
        import captum.attr as attr  # optional: captum (the groundtruth extra)
    except ImportError as err:
        raise ModelNotAvailableError(
            "the input attributions (saliency, input x gradient, integrated gradients) need "
            "captum, which is not installed: pip install 'cwlens[groundtruth]' (or pip "
            "install captum).") from err
    return attr


def input_scores(handle: ModelHandle, tokens: torch.Tensor, cache,
                 answers: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{method: [batch, query_pos, key_pos]}`` float64 for every ``input`` method, from
    ``cache`` (:func:`cwlens.circuits.run_with_cache` of ``tokens``) and captum's passes.
    Rollout averages each layer's real heads, tracr's padding heads left out
    (:func:`cwlens.groundtruth.padding.without_padding`). Row 0 (BOS, not an output) is
    left at 0 for the captum methods."""
    patterns = torch.stack([adapter.read(cache, hook_names.pattern(ly), handle)
                            for ly in range(handle.n_layers)])  # [layer, b, h, q, k]
    out = {"rollout": rollout(without_padding(patterns, padding_heads(handle))).cpu()}
    out.update(final_flows(cache, handle))
    out.update(captum_scores(handle, tokens, answers))
    return out


def final_flows(cache, handle: ModelHandle) -> dict[str, torch.Tensor]:
    """``{"flow_<rule>": [batch, query_pos, key_pos]}``: the token flow's composed flows into
    the final stream (:func:`cwlens.circuits.token_flow`'s ``flows[-1]``) for every rule, all
    sequences of the batch at once (one geometry per layer; equal to ``token_flow`` run on
    each sequence, tests/test_groundtruth_scoring.py)."""
    adapter.check_residual_model(handle, "The token flow")
    adapter.check_residual_sum(cache, handle, "The token flow")
    per_rule: dict[str, list[torch.Tensor]] = {rule: [] for rule in FLOW_RULES}
    for layer in range(handle.n_layers):
        r = adapter.read(cache, hook_names.resid_pre(layer), handle).double()
        a = adapter.read(cache, hook_names.resid_mid(layer), handle).double() - r
        geo = adapter.geometry(cache, handle, layer)
        c = geo.contribution("inter").sum(1).double()  # [b, query, key]
        pattern, v, w_o = geo.pattern.double(), geo.v.double(), geo.W_O.double()
        v_heads = v.repeat_interleave(w_o.shape[0] // v.shape[2], dim=2)  # [b, key, head, d]
        read = torch.einsum("bqm,hdm->bqhd", r + a, w_o)
        dots = torch.einsum("bhqk,bqhd,bkhd->bqk", pattern, read, v_heads)
        for rule in FLOW_RULES:
            per_rule[rule].append(flow_math.layer_flow(r, a, c, rule, dots if rule == "projection" else None))
    return {f"flow_{rule}": flow_math.compose(torch.stack(f))[-1].cpu() for rule, f in per_rule.items()}


def captum_scores(handle: ModelHandle, tokens: torch.Tensor, answers: torch.Tensor) -> dict[str, torch.Tensor]:
    """Saliency, input x gradient and integrated gradients of ``y_q`` for every output
    position ``q >= 1`` w.r.t. the layer-0 residual, reduced over ``d_model``:
    ``{method: [batch, query_pos, key_pos]}`` float64 (row 0 left at 0).

    One captum call per method: the batch is repeated once per output position, and row
    ``(q, b)`` returns ``y_q`` of sequence ``b`` (each row's attribution is its own: rows
    do not interact)."""
    attr = require_captum()
    b, n = tokens.shape
    name = hook_names.resid_pre(0)
    with torch.no_grad():
        _, cache = handle.cached_run(tokens, {name}.__contains__)
    x = cache[name].detach()
    positions = torch.arange(1, n).repeat_interleave(b)  # row (q, b) -> q
    x_rows = x.repeat(n - 1, 1, 1)
    answer_rows = answers.repeat(n - 1, 1)

    def forward(embedded: torch.Tensor, answers: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        def replace(resid: torch.Tensor, hook) -> torch.Tensor:
            return embedded.to(resid.dtype)

        rows = tokens[:1].expand(embedded.shape[0], n)  # the embedding is replaced anyway
        with handle.hooks([(name, replace)]):
            y = outputs(handle.model(rows), answers)  # [rows, pos]
        return y.gather(1, positions[:, None].to(y.device))[:, 0]

    methods = {"saliency": attr.Saliency(forward), "input_x_gradient": attr.InputXGradient(forward),
               "integrated_gradients": attr.IntegratedGradients(forward)}
    options: dict[str, dict] = {"saliency": {"abs": True}, "input_x_gradient": {},
                                "integrated_gradients": {"n_steps": IG_STEPS,
                                                         "baselines": torch.zeros_like(x_rows)}}
    out = {}
    for m, method in methods.items():
        a = method.attribute(x_rows.clone().requires_grad_(True),
                             additional_forward_args=(answer_rows, positions), **options[m])
        reduced = a.detach().double().sum(-1).cpu().view(n - 1, b, n).transpose(0, 1)  # [b, q, key]
        scores = torch.zeros(b, n, n, dtype=torch.float64)
        scores[:, 1:] = reduced if m == "saliency" else reduced.abs()
        out[m] = scores
    return out
