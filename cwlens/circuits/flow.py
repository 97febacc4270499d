"""Token flow graph of one sequence from a cache (see :mod:`cwlens.circuits.flow_math`
for the definition): composed flows, node importances and a pruned, NetworkX-free edge
table. The plotly figure is :func:`cwlens.plotting.token_flow.token_flow_figure`.
"""

from dataclasses import dataclass, field

import torch

from cwlens.circuits import checks, flow_math
from cwlens.engine import adapter, hook_names
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.errors import ShapeMismatchError


@dataclass(frozen=True)
class TokenFlow:
    """Flows of one sequence, float64 on the CPU.

    Attributes:
        layer_flows: ``[layer, pos, pos]``, ``F_l``.
        flows: ``[layer + 1, pos, pos]``: ``flows[l][i, j]`` = share of position ``i``'s
            residual entering layer ``l`` that comes from input token ``j``.
        resid_share, attn_share: ``[layer, pos]``, ``s^res`` and ``s^att``.
        str_tokens: the token strings; rule: ``"projection"`` (default), ``"signed"`` or
            ``"absolute"`` (:mod:`cwlens.circuits.flow_math`).
        support: ``[layer, pos, pos]`` bool, where a layer's flow may be non-zero at all
            (a position itself and the keys its query attends to; None: everywhere).
    """

    layer_flows: torch.Tensor
    flows: torch.Tensor
    resid_share: torch.Tensor
    attn_share: torch.Tensor
    str_tokens: tuple = field(repr=False)
    rule: str = "projection"
    support: torch.Tensor | None = field(default=None, repr=False)

    @property
    def n_layers(self) -> int:
        return self.layer_flows.shape[0]

    def _target(self, target: int) -> int:
        return checks.index(target, self.layer_flows.shape[-1], "target position")

    def input_attribution(self, target: int = -1) -> torch.Tensor:
        """``[pos]``: how much of the final stream at ``target`` comes from each input token."""
        return self.flows[-1][self._target(target)]

    def node_importance(self, target: int = -1) -> torch.Tensor:
        """``[layer + 1, pos]``: share of the final stream at ``target`` routed through each node."""
        return flow_math.node_importance(self.layer_flows, self._target(target))

    def edges(self, target: int = -1, threshold: float = 0.02, top: int | None = None) -> list[dict]:
        """Edges ``(layer, from_pos) -> (layer + 1, to_pos)`` with ``|weight| >= threshold``
        (strongest first; at most ``top``): dicts with ``layer, from_pos, to_pos, weight,
        from_token, to_token``. Self edges (``from_pos == to_pos``) carry the residual share.
        Only edges that exist are listed, even at ``threshold=0``: never from a key its query
        does not attend to (after it on a decoder, outside a window) nor into a node the
        target cannot be reached from (a position after the target on a decoder)."""
        t = self._target(target)
        w = flow_math.edge_weights(self.layer_flows, t)
        exists = torch.ones_like(w, dtype=torch.bool) if self.support is None else self.support
        reach = flow_math.reachable(exists, t)
        keep = ((w.abs() >= threshold) & exists & reach[1:, :, None]).nonzero().tolist()
        rows = [
            {"layer": ly, "from_pos": j, "to_pos": i, "weight": float(w[ly, i, j]),
             "from_token": self.str_tokens[j], "to_token": self.str_tokens[i]}
            for ly, i, j in keep
        ]
        rows.sort(key=lambda r: -abs(r["weight"]))
        return rows[:top] if top is not None else rows

    def edges_dataframe(self, target: int = -1, threshold: float = 0.02, top: int | None = None):
        import pandas as pd  # heavy: pandas, imported on use

        cols = ["layer", "from_pos", "to_pos", "weight", "from_token", "to_token"]
        return pd.DataFrame(self.edges(target, threshold, top), columns=cols)


@takes_model
def token_flow(cache, model: ModelLike, batch: int = 0, rule: str = "projection", str_tokens=None,
               closure_tolerance: float = 1e-3) -> TokenFlow:
    """The token flow of sequence ``batch`` of a cache from :func:`cwlens.circuits.run_with_cache`.

    Checks first that the residual stream is the plain sum of the blocks' outputs and that
    what attention added (minus ``b_O``) is what the heads' ``a_ij v~_j`` terms rebuild
    (relative error ``<= closure_tolerance``, :func:`~cwlens.engine.adapter.check_residual_sum`);
    otherwise the shares would not describe the contribution weights' output.

    A padded row (a list of texts; the cache remembers its mask) is read at its real
    tokens only: its flows are the text's own, positions numbered from its first real
    token as in a single run (``str_tokens`` may be the row's real tokens or the padded
    row's, whose pad entries are dropped).
    """
    flow_math.check_rule(rule)
    adapter.check_residual_model(model, "The token flow")
    checks.residual_hooks(cache, model, "The token flow")
    b, n = adapter.read(cache, hook_names.resid_pre(0), model).shape[:2]
    batch = checks.index(batch, b, "batch")
    mask = adapter.cache_mask(cache)
    keep = torch.arange(n) if mask is None else mask[batch].bool().cpu().nonzero()[:, 0]
    if str_tokens is not None and mask is not None and len(str_tokens) == n and len(keep) < n:
        str_tokens = [str_tokens[i] for i in keep.tolist()]  # the padded row's tokens
    n = len(keep)
    if str_tokens is not None:
        if isinstance(str_tokens, str | bytes) or len(str_tokens) != n:
            raise ShapeMismatchError(
                f"str_tokens must be a list of {n} token strings (the cached run's positions, "
                f"e.g. model.to_str_tokens(tokens[{batch}])); got "
                + (f"a string {str_tokens!r}" if isinstance(str_tokens, str | bytes)
                   else f"{len(str_tokens)} entries") + ".")
    adapter.check_residual_sum(cache, model, "The token flow", closure_tolerance)
    resid_share, attn_share, layer_flows = [], [], []
    for layer in range(model.n_layers):
        r = adapter.read(cache, hook_names.resid_pre(layer), model)[batch].double()
        a = adapter.read(cache, hook_names.resid_mid(layer), model)[batch].double() - r
        geo = adapter.geometry(cache, model, layer)
        c = geo.contribution("inter")[batch].sum(0).double()  # [query, key]
        pattern, v = geo.pattern[batch], geo.v[batch]
        if len(keep) < r.shape[0]:  # a padded row: its real positions only
            k = keep.to(r.device)
            r, a, c = r[k], a[k], c[k][:, k]
            pattern, v = pattern[:, k][:, :, k], v[k]
        s_res, s_att = flow_math.residual_shares(r, a, rule)
        resid_share.append(s_res)
        attn_share.append(s_att)
        dots = None
        if rule == "projection":
            dots = flow_math.key_projections(r + a, pattern.double(), v.double(),
                                             geo.W_O.double())
        layer_flows.append(flow_math.layer_flow(r, a, c, rule, dots))
    flows = torch.stack(layer_flows).cpu()
    if str_tokens is None:
        str_tokens = [str(i) for i in range(n)]
    n_layers = model.n_layers
    support = flow_math.support(n, n_layers, not model.is_encoder,
                                [model.attention_window(ly) for ly in range(n_layers)])
    return TokenFlow(flows, flow_math.compose(flows), torch.stack(resid_share).cpu(),
                     torch.stack(attn_share).cpu(), tuple(str_tokens), rule, support)
