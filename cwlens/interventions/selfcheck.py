"""Interventions prove they act: one tiny forward per model and hook kind, then cached.

cwlens edits two hook points: ``hook_pattern`` (value masking, the sink-rate sweep) and
``hook_v`` (the sink-value scaling). On some models an edit there would be dropped (the
TransformerLens 4.x bridge fires ``hook_pattern`` after a wrapped BERT attention has
used it), and every "effect" measured would be an exact, meaningless 0. So before the
first intervention of a kind on a model, :func:`ensure_edits_act` runs a 6-token forward
with the edit that must show:

- ``pattern``: head 0's pattern set to 0 in every layer  =>  ``hook_z[:, :, 0] = 0``
  (``z_i = sum_j a_ij v_j``), although it is non-zero in the clean run;
- ``values``: ``hook_v`` set to 0 in every layer  =>  ``hook_z = 0``.

Where the model has no ``hook_z``, the logits must change instead. Failing models raise
:class:`~cwlens.errors.InterventionNotAppliedError`; passing ones are remembered (weakly,
per model object), so the check costs two small forwards once.
"""

import weakref
from collections.abc import Iterable

import torch

from cwlens import hook_names
from cwlens.errors import InterventionNotAppliedError

_VERIFIED: "weakref.WeakKeyDictionary[object, set[str]]" = weakref.WeakKeyDictionary()


def kinds_of(hook_point_names: Iterable[str]) -> set[str]:
    """Which checked kinds (``pattern``, ``values``) a list of hook names edits."""
    kinds = set()
    for name in hook_point_names:
        if name.endswith("attn.hook_pattern"):
            kinds.add("pattern")
        elif name.endswith("attn.hook_v"):
            kinds.add("values")
    return kinds


def _probe_tokens(model) -> torch.Tensor:
    n_vocab = int(getattr(model.cfg, "d_vocab", 0) or 8)
    ids = [i % n_vocab for i in range(5, 11)]
    device = getattr(model.cfg, "device", None) or "cpu"
    return torch.tensor([ids], dtype=torch.long, device=device)


def _run(model, tokens, edit_name, edit_fn, z_names):
    seen = {}

    def keeper(name):
        def keep(z, hook):
            seen[name] = z.detach().float().clone()
        return keep

    hooks = [(n, keeper(n)) for n in z_names]
    if edit_name is not None:
        hooks = [(edit_name(ly), edit_fn) for ly in range(model.cfg.n_layers)] + hooks
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return logits, seen


def _zero_head0(pattern, hook=None):
    out = pattern.clone()
    out[:, 0] = 0
    return out


_zero_head0.cwlens_blockwise = True  # type: ignore[attr-defined]  # row-wise: fine on blocks


def _zero(v, hook=None):
    return torch.zeros_like(v)


def ensure_edits_act(model, kinds: Iterable[str]) -> None:
    """Raise :class:`InterventionNotAppliedError` unless edits of ``kinds`` change the run.

    ``kinds``: ``"pattern"`` and/or ``"values"``. Enables the pattern seam of delegating
    bridge attentions first (:mod:`cwlens.models.pattern_seam`). Cached per model.
    """
    from cwlens.models.pattern_seam import enable_pattern_edits

    done = _VERIFIED.setdefault(model, set())
    todo = [k for k in ("pattern", "values") if k in set(kinds) - done]
    if not todo:
        return
    if "pattern" in todo:
        enable_pattern_edits(model)
    tokens = _probe_tokens(model)
    z_names = [hook_names.z(ly) for ly in range(model.cfg.n_layers)]
    z_names = [n for n in z_names if n in model.hook_dict]
    clean_logits, clean = _run(model, tokens, None, None, z_names)
    for kind in todo:
        name, fn, heads = {
            "pattern": (hook_names.pattern, _zero_head0, slice(0, 1)),
            "values": (hook_names.values, _zero, slice(None)),
        }[kind]
        logits, edited = _run(model, tokens, name, fn, z_names)
        if z_names:
            failed = [
                n for n in z_names
                if clean[n][:, :, heads].abs().max() > 0
                and edited[n][:, :, heads].abs().max() > 1e-6 * clean[n][:, :, heads].abs().max()
            ]
        else:
            failed = ["logits"] if torch.equal(logits, clean_logits) else []
        if failed:
            raise InterventionNotAppliedError(
                f"Edits of {name(0).replace('blocks.0.', 'blocks.*.')} have no effect on this "
                f"{type(model).__name__} ({failed[0]} unchanged when they should be 0), so "
                "masking or sink interventions would report zeros. On TransformerLens 4.x, "
                "load the model with cwlens.load_model; for BERT-like encoders, TransformerLens "
                "3.x's HookedEncoder (load_model(..., generation='hooked')) hooks the pattern "
                "inside the attention."
            )
        done.add(kind)
