"""Interventions prove they act: one tiny forward per model and hook kind, then cached.

cwlens edits two hook points: ``hook_pattern`` (value masking, the sink-rate sweep) and
``hook_v`` (the sink-value scaling). On some models an edit there would be dropped (the
TransformerLens 4.x bridge fires ``hook_pattern`` after a wrapped BERT attention has
used it), and every "effect" measured would be an exact, meaningless 0. So before the
first intervention of a kind on a model, :func:`ensure_edits_act` runs a 6-token forward
(fewer where the model's context is shorter)
with the edit that must show:

- ``pattern``: head 0's pattern set to 0 in every layer  =>  ``hook_z[:, :, 0] = 0``
  (``z_i = sum_j a_ij v_j``), although it is non-zero in the clean run;
- ``values``: ``hook_v`` set to 0 in every layer  =>  ``hook_z = 0``.

Where the model has no ``hook_z``, the logits must change instead. Failing models raise
:class:`~cwlens.errors.InterventionNotAppliedError`; passing ones are remembered (weakly,
on the model's handle), so the check costs two small forwards once.
"""

from collections.abc import Iterable

import torch

from cwlens.engine import hook_names
from cwlens.engine.handle import ModelHandle
from cwlens.errors import InterventionNotAppliedError


def kinds_of(hook_point_names: Iterable[str]) -> set[str]:
    """Which checked kinds (``pattern``, ``values``) a list of hook names edits."""
    kinds = set()
    for name in hook_point_names:
        if name.endswith("attn.hook_pattern"):
            kinds.add("pattern")
        elif name.endswith("attn.hook_v"):
            kinds.add("values")
    return kinds


def _zero_head0(pattern, hook=None):
    out = pattern.clone()
    out[:, 0] = 0
    return out


_zero_head0.cwlens_blockwise = True  # type: ignore[attr-defined]  # row-wise: fine on blocks


def _zero(v, hook=None):
    return torch.zeros_like(v)


def ensure_edits_act(handle: ModelHandle, kinds: Iterable[str]) -> None:
    """Raise :class:`InterventionNotAppliedError` unless edits of ``kinds`` change the run.

    ``kinds``: ``"pattern"`` and/or ``"values"``. Enables the pattern seam of delegating
    bridge attentions first (:mod:`cwlens.engine.pattern_seam`). Cached per model.
    """
    done = handle.verified_edits
    todo = [k for k in ("pattern", "values") if k in set(kinds) - done]
    if not todo:
        return
    if "pattern" in todo:
        handle.enable_pattern_edits()
    n = min(6, handle.context_length() or 6)  # a compiled tracr model may take only 3
    tokens = torch.tensor([[i % (handle.d_vocab or 8) for i in range(5, 5 + n)]],
                          dtype=torch.long, device=handle.device)
    z_names = [hook_names.z(ly) for ly in range(handle.n_layers)]
    z_names = [n for n in z_names if handle.has_hook(n)]

    def run(edit_name, edit_fn) -> tuple[torch.Tensor, dict]:
        """The logits and every layer's ``hook_z`` with ``edit_fn`` at ``edit_name(layer)``
        in every layer (None: the clean run)."""
        seen: dict[str, torch.Tensor] = {}

        def keeper(name):
            def keep(z, hook):
                seen[name] = z.detach().float().clone()
            return keep

        hooks = [(n, keeper(n)) for n in z_names]
        if edit_name is not None:
            hooks = [(edit_name(ly), edit_fn) for ly in range(handle.n_layers)] + hooks
        with torch.no_grad():
            logits = handle.run_with_hooks(tokens, hooks)
        return logits, seen

    clean_logits, clean = run(None, None)
    for kind in todo:
        name, fn, heads = {
            "pattern": (hook_names.pattern, _zero_head0, slice(0, 1)),
            "values": (hook_names.values, _zero, slice(None)),
        }[kind]
        logits, edited = run(name, fn)
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
                f"{handle.class_name} ({failed[0]} unchanged when they should be 0), so "
                "masking or sink interventions would report zeros. On TransformerLens 4.x, "
                "load the model with cwlens.load_model; for BERT-like encoders, TransformerLens "
                "3.x's HookedEncoder (load_model(..., generation='hooked')) hooks the pattern "
                "inside the attention."
            )
        done.add(kind)
