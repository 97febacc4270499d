"""One streamed forward pass, under the public functions of :mod:`cwlens.engine.streaming`:
the taps that catch each layer's ``hook_v`` and ``hook_pattern`` (whole layers, or query
blocks under blockwise attention) and the closure check. The hooks only read.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch

from cwlens.core.geometry import AttentionGeometry
from cwlens.engine import adapter, hook_names
from cwlens.engine.handle import ModelHandle
from cwlens.engine.measures import Closure, closure_errors
from cwlens.engine.models import blockwise
from cwlens.errors import CwlensError


class _Taps:
    """Catches ``hook_v`` and ``hook_pattern`` of each layer; calls ``on_layer`` once both
    are in (in whichever order the model fires them), then drops them.

    Under blockwise attention (:mod:`cwlens.engine.models.blockwise`) ``hook_pattern`` fires once
    per query block: each block goes to ``on_block(layer, block, rows, v)`` (``block``
    says where the rows sit), after ``hook_v`` (which fires first, with all keys)."""

    def __init__(self, layers: Sequence[int], on_layer: Callable[..., None],
                 on_block: Callable[..., None] | None = None):
        self.layers = list(layers)
        self.on_layer = on_layer
        self.on_block = on_block
        self.pending: dict[int, dict[str, torch.Tensor]] = {}
        self.residuals: dict[int, torch.Tensor] = {}  # hook_resid_pre: fires before v
        self.done: list[int] = []

    def _catch_residual(self, layer: int):
        def catch(tensor: torch.Tensor, hook) -> None:
            self.residuals[layer] = tensor.detach()
            return None

        catch.__name__ = f"cwlens_stream_resid_pre_{layer}"
        return catch

    def _catch(self, layer: int, what: str):
        def catch(tensor: torch.Tensor, hook) -> None:
            block = blockwise.current_block() if what == "pattern" else None
            if block is not None:
                v = self.pending.get(layer, {}).get("v")
                if v is None or self.on_block is None:
                    raise CwlensError(
                        f"Layer {layer}: a blockwise attention block arrived before "
                        f"{hook_names.values(layer)!r}; run with attention='eager'.")
                self.on_block(layer, block, tensor.detach(), v, self.residuals.get(layer))
                if block.last:
                    del self.pending[layer]
                    self.residuals.pop(layer, None)
                    self.done.append(layer)
                return None
            slot = self.pending.setdefault(layer, {})
            slot[what] = tensor.detach()
            if len(slot) == 2:
                del self.pending[layer]
                self.on_layer(layer, slot["pattern"], slot["v"], self.residuals.pop(layer, None))
                self.done.append(layer)
            return None  # read only: the forward pass goes on unchanged

        catch.__name__ = f"cwlens_stream_{what}_{layer}"
        catch.cwlens_blockwise = True  # type: ignore[attr-defined]  # takes query blocks
        return catch

    def hooks(self) -> list[tuple[str, Callable]]:
        out = []
        for layer in self.layers:
            out.append((hook_names.values(layer), self._catch(layer, "v")))
            out.append((hook_names.pattern(layer), self._catch(layer, "pattern")))
            out.append((hook_names.resid_pre(layer), self._catch_residual(layer)))
        return out


class _Assembler:
    """Blockwise runs for whole-layer consumers: the blocks of a layer are written into one
    ``[batch, head, query, key]`` tensor, handed to ``on_layer`` once complete, then freed."""

    def __init__(self, on_layer: Callable[..., None]):
        self.on_layer = on_layer
        self.full: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, block, rows: torch.Tensor, v: torch.Tensor, residual=None) -> None:
        if layer not in self.full:
            b, h = rows.shape[:2]
            self.full[layer] = rows.new_zeros(b, h, block.n_queries, block.n_keys)
        self.full[layer][:, :, block.query_start : block.query_start + block.n_rows, : block.key_stop] = rows
        if block.last:
            self.on_layer(layer, self.full.pop(layer), v, residual)


class _Stop(Exception):
    """Raised after the last needed layer when the logits are not wanted."""


def _raise_stop(tensor: torch.Tensor, hook) -> None:
    raise _Stop


class StreamedPass:
    """One streamed forward pass: taps, the closure check, blockwise or eager attention."""

    def __init__(self, handle: ModelHandle, layers: list[int], attention_mask: torch.Tensor | None,
                 closure: bool):
        """``layers``: resolved (:func:`cwlens.engine.adapter.resolve_requested_layers`) by
        the public function that made the pass; trusted here."""
        self.handle = handle
        self.layers = layers
        self.attention_mask = attention_mask
        self.mask = None if attention_mask is None else attention_mask.bool()
        self.closure = closure
        self.rebuilt: dict[int, torch.Tensor] = {}
        self.targets: dict[int, torch.Tensor] = {}
        self.errors: dict[int, tuple[float, float]] = {}

    def geometry(self, layer: int, pattern: torch.Tensor, v: torch.Tensor,
                 residual: torch.Tensor | None = None) -> AttentionGeometry:
        return adapter.layer_geometry(self.handle, layer, pattern, v, self.mask, residual)

    def rebuilt_output(self, layer: int, output: torch.Tensor) -> None:
        """What the heads x keys rebuild for ``layer`` ([batch, pos, d_model]): checked
        against the model's own output of the heads, whichever comes first."""
        if layer in self.targets:
            self.errors[layer] = closure_errors(output, self.targets.pop(layer), self.attention_mask)
        else:
            self.rebuilt[layer] = output

    def _check(self, layer: int):
        # the heads' output usually fires after the pattern; where the pattern hook fires
        # after the attention module returns (the bridge's BERT), it comes first
        def check_closure(tensor: torch.Tensor, hook) -> None:
            target = adapter.heads_output_from(self.handle, layer, tensor.detach())
            if layer in self.rebuilt:
                self.errors[layer] = closure_errors(self.rebuilt.pop(layer), target, self.attention_mask)
            else:
                self.targets[layer] = target
            return None

        return check_closure

    def run(self, input, fn, on_block, context, logits: bool, forward_kwargs: dict
            ) -> tuple[Any, ...]:
        """Run the forward in ``context`` (the attention: blockwise or the model's own,
        :func:`cwlens.engine.streaming.attention_context`); ``fn(layer, geometry)`` for whole
        layers, or ``on_block(layer, block, rows, v)`` for blockwise runs where given."""
        handle, resolved = self.handle, self.layers  # input: checked by _tokens
        results: dict[int, Any] = {}

        def on_layer(layer: int, pattern: torch.Tensor, v: torch.Tensor, residual=None) -> None:
            geo = self.geometry(layer, pattern, v, residual)
            if self.closure:  # [batch, pos, d_model] tensors: small
                self.rebuilt_output(layer, geo.layer_output)
            results[layer] = fn(layer, geo)

        if on_block is not None:
            def block_then_mark(layer, block, rows, v, residual=None):
                on_block(layer, block, rows, v, residual)
                if block.last:
                    results[layer] = None

            taps = _Taps(resolved, on_layer, block_then_mark)
        else:
            taps = _Taps(resolved, on_layer, _Assembler(on_layer))
        # the residual stream is caught for ALTI where the model names it (cheap: a reference)
        hooks = [(name, fn) for name, fn in taps.hooks()
                 if name.endswith(("hook_v", "hook_pattern")) or handle.has_hook(name)]
        if self.closure:
            hooks += [(adapter.closure_hook(handle, ly), self._check(ly)) for ly in resolved]
        stop = hook_names.resid_post(max(resolved))
        if not logits and handle.has_hook(stop):
            hooks.append((stop, _raise_stop))
        forward_kwargs = dict(forward_kwargs)
        forward_kwargs.update(handle.forward_kwargs(self.attention_mask))
        out_logits = None
        with torch.no_grad(), context, handle.hooks(hooks):
            try:
                out_logits = handle.model(input, **forward_kwargs)
            except _Stop:
                pass
        if not logits:
            out_logits = None
        missing = [ly for ly in resolved if ly not in results]
        if missing:
            raise CwlensError(
                f"Layers {missing} did not fire both {hook_names.values(missing[0])!r} and "
                f"{hook_names.pattern(missing[0])!r} during the forward pass: this model's "
                "attention does not expose its pattern through TransformerLens hooks."
            )
        outputs = [results[ly] for ly in resolved]
        if not self.closure:
            return out_logits, outputs
        if any(ly not in self.errors for ly in resolved):
            raise CwlensError(
                f"The closure hook {adapter.closure_hook(handle, resolved[0])!r} did not fire: "
                "the closure check cannot be made on this model."
            )
        errors = self.errors
        return (out_logits, outputs, Closure(
            tuple(resolved), tuple(errors[ly][0] for ly in resolved), tuple(errors[ly][1] for ly in resolved)
        ))
