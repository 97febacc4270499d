"""Activation patching of single heads through ``hook_z`` (TransformerLens hooks).

For head ``h`` of layer ``l`` the clean run is repeated with ``z^h`` (the head's mixed
values, ``blocks.{l}.attn.hook_z``) replaced by

    mode="corrupt"   its value on the corrupted prompts (same positions), or
    mode="mean"      its mean over the clean batch at each position (mean ablation),

and the effect is ``metric(clean) - metric(patched)``, averaged over the batch: positive
where the head carries what the clean prompt needs. All heads of one layer are patched in
one forward pass (the batch is repeated once per head), so a model costs ``n_layers``
passes of ``n_heads x batch`` sequences. Hooks are added through the model's own hooks context
and removed on exit.
"""

from collections.abc import Callable

import torch

from cwlens.circuits.results import HeadScores
from cwlens.engine import hook_names
from cwlens.engine.adapter import resolve_layers
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.errors import InvalidArgumentError, ShapeMismatchError, UnknownOptionError
from cwlens.runs.progress import tick

Metric = Callable[[torch.Tensor], torch.Tensor]  # logits [batch, pos, vocab] -> [batch]
MODES = ("corrupt", "mean")


def replace_heads_hook(source: torch.Tensor, batch: int) -> Callable:
    """A ``hook_z`` hook for a batch repeated once per head: in copy ``h`` (rows
    ``h*batch .. (h+1)*batch``) head ``h``'s ``z`` is replaced by ``source[:, :, h]``."""

    def replace_heads(z: torch.Tensor, hook) -> torch.Tensor:
        z = z.clone()
        n_heads = z.shape[2]
        for h in range(n_heads):
            rows = slice(h * batch, (h + 1) * batch)
            z[rows, :, h] = source[:, :, h].to(z.dtype)
        return z

    return replace_heads


def _z_of(handle: ModelHandle, tokens: torch.Tensor) -> dict[int, torch.Tensor]:
    names = {hook_names.z(layer) for layer in range(handle.n_layers)}
    with torch.no_grad():
        _, cache = handle.cached_run(tokens, names.__contains__)
    return {layer: cache[hook_names.z(layer)] for layer in range(handle.n_layers)}


def patch_effects(
    handle: ModelHandle,
    clean: torch.Tensor,
    metric: Metric,
    corrupted: torch.Tensor | None = None,
    mode: str = "corrupt",
    layers=None,
) -> torch.Tensor:
    """Per prompt, the effect of patching each head's ``hook_z``:
    ``metric(clean) - metric(patched)``, ``[batch, layer, head]`` float64 (CPU);
    :func:`patch_heads` is its mean over the batch (``mode="mean"`` ablates to the mean of
    this batch, so a prompt's effect depends on the others there). Arguments as
    :func:`patch_heads`."""
    if mode not in MODES:
        raise UnknownOptionError(f"Unknown patching mode={mode!r}. Valid modes: 'corrupt', 'mean'.")
    if not callable(metric):
        raise InvalidArgumentError(f"metric must be a function logits -> [batch]; got {metric!r}.")
    for what, toks in (("clean", clean), ("corrupted", corrupted)):
        if toks is not None and (not isinstance(toks, torch.Tensor) or toks.ndim != 2):
            raise InvalidArgumentError(
                f"{what} must be a [batch, pos] tensor of token ids; got "
                f"{type(toks).__name__}{'' if not isinstance(toks, torch.Tensor) else f' {tuple(toks.shape)}'}. "
                "Patching replaces a head's z at the same positions in every prompt, so texts "
                "must be tokens of one length: model.to_tokens(texts) where they tokenize to "
                "equal lengths (a padded list of texts would patch pads into tokens).")

    chosen, _ = resolve_layers(handle.n_layers, layers)
    if mode == "corrupt":
        if corrupted is None or corrupted.shape != clean.shape:
            got = None if corrupted is None else tuple(corrupted.shape)
            raise ShapeMismatchError(
                f"mode='corrupt' needs corrupted tokens shaped like the clean ones "
                f"{tuple(clean.shape)}; got {got}. Pass corrupted=... or use mode='mean'."
            )
        sources = _z_of(handle, corrupted)
    else:
        sources = {ly: z.mean(0, keepdim=True).expand_as(z) for ly, z in _z_of(handle, clean).items()}
    n_layers, n_heads, batch = handle.n_layers, handle.n_heads, clean.shape[0]
    # progress in sequences run, so that a bar's rate, and its time left, follow the work:
    # the batch twice, then n_heads x batch per patched layer (one pass each)
    tick(batch)
    with torch.no_grad():
        base = metric(handle(clean)).double()
        tick(batch)
        repeated = clean.repeat(n_heads, 1)
        effect = torch.zeros(batch, n_layers, n_heads, dtype=torch.float64)
        for layer in chosen:
            hook = replace_heads_hook(sources[layer], batch)
            with handle.hooks([(hook_names.z(layer), hook)]):
                patched = metric(handle(repeated)).double().view(n_heads, batch)
            effect[:, layer] = (base[None, :] - patched).T.cpu()
            tick(n_heads * batch)  # progress: one pass of the batch once per head
    return effect


@takes_model
def patch_heads(
    model: ModelLike,
    clean: torch.Tensor,
    metric: Metric,
    corrupted: torch.Tensor | None = None,
    mode: str = "corrupt",
    layers=None,
) -> HeadScores:
    """Effect of patching each head's ``hook_z``: ``metric(clean) - metric(patched)``,
    averaged over the batch (:func:`patch_effects` has it per prompt).

    Args:
        clean, corrupted: ``[batch, pos]`` tokens of equal shape (``corrupted`` is needed
            for ``mode="corrupt"``).
        metric: logits ``[batch, pos, d_vocab]`` -> ``[batch]`` (e.g. a logit difference).
        layers: the layers to patch (default all); other layers get 0.
    """
    effect = patch_effects(model, clean, metric, corrupted, mode, layers).mean(0)
    what = "corrupted run" if mode == "corrupt" else "clean-batch mean"
    return HeadScores(
        "patching", effect, f"drop of the metric when the head's z is patched from the {what}"
    )
