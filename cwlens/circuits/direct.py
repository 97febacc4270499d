"""Direct logit attribution per head and source token, from a cache (the adapter part).

See :mod:`cwlens.circuits.direct_math` for the math. The final norm's scale is frozen at
its value in the run (read from ``ln_final.hook_scale``), the choice TransformerLens makes
for direct logit attribution: with it the attribution is exactly linear and complete.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cwlens.circuits import checks, direct_math
from cwlens.circuits.results import HeadScores
from cwlens.engine import adapter, hook_names
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.errors import NonFiniteError, ShapeMismatchError


@dataclass(frozen=True)
class DirectLogitAttribution:
    """Each head's and each source token's direct effect on a logit difference.

    Attributes:
        head_terms: ``[batch, n_queries, layer, head_index, key_pos]`` float64: the
            ``a_ij^h v~_j^h`` terms read through the frozen final norm and ``u``.
        components: other residual components, name -> ``[batch, n_queries]``:
            ``"embed"``, ``"L{l} b_O"``, ``"L{l} mlp"`` and ``"constant"`` (final-norm bias
            and unembedding bias).
        logit_diff: ``[batch, n_queries]``, the logit difference the model computed.
        queries: the query positions.
    """

    head_terms: torch.Tensor
    components: dict
    logit_diff: torch.Tensor
    queries: tuple[int, ...]

    @property
    def total(self) -> torch.Tensor:
        """Sum of every term: ``[batch, n_queries]`` (equals :attr:`logit_diff`)."""
        return self.head_terms.sum((-3, -2, -1)) + sum(self.components.values())

    @property
    def completeness_error(self) -> float:
        """``max |total - logit_diff|`` (float rounding only, for the frozen scale)."""
        return float((self.total - self.logit_diff).abs().max())

    def head_scores(self) -> HeadScores:
        """Each head's direct effect, summed over keys, mean over batch and queries."""
        values = self.head_terms.sum(-1).mean((0, 1)).cpu()
        return HeadScores("direct_logit", values, "direct effect of the head on the logit difference")

    def token_scores(self) -> torch.Tensor:
        """``[batch, n_queries, key_pos]``: each source token's direct effect through all heads."""
        return self.head_terms.sum((-3, -2))

    def components_dataframe(self):
        """One row per component (heads summed per layer) with its mean term."""
        import pandas as pd  # heavy: pandas, imported on use

        rows = [{"component": k, "mean": float(v.mean())} for k, v in self.components.items()]
        per_layer = self.head_terms.sum((-2, -1)).mean((0, 1))
        rows += [{"component": f"L{ly} heads", "mean": float(x)} for ly, x in enumerate(per_layer)]
        return pd.DataFrame(rows)


@takes_model
def direct_logit_attribution(
    cache,
    model: ModelLike,
    logits: torch.Tensor,
    queries: Sequence[int],
    answers: torch.Tensor,
    foils: torch.Tensor | None = None,
) -> DirectLogitAttribution:
    """Direct logit attribution of every head's ``a_ij v~_j`` terms at ``queries``.

    Args:
        cache: from :func:`cwlens.circuits.run_with_cache` (or a cache holding the same hooks).
        logits: ``[batch, pos, d_vocab]`` of the same run (for the completeness check).
        queries: query positions (shared by the batch). On a padded batch (a list of
            texts; the cache remembers its mask) a position that is padding in some row is
            refused; on a left-padded decoder -1 is every text's last token.
        answers: ``[batch, n_queries]`` token ids; ``foils`` the same shape, or None for
            "answer logit minus the mean logit".
    """
    adapter.check_residual_model(model, "Direct logit attribution")
    checks.residual_hooks(cache, model, "Direct logit attribution")
    b, n = adapter.read(cache, hook_names.resid_pre(0), model).shape[:2]
    q = checks.positions(queries, n)
    W_U, b_U = model.unembed()
    d_vocab = W_U.shape[-1]
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (b, n, d_vocab):
        raise ShapeMismatchError(
            f"logits must be the [batch, pos, d_vocab] = [{b}, {n}, {d_vocab}] logits of the "
            "cached run (the first output of cwlens.circuits.run_with_cache); got "
            + (str(list(logits.shape)) if isinstance(logits, torch.Tensor) else type(logits).__name__) + ".")
    if not bool(torch.isfinite(logits[:, q]).all()):
        raise NonFiniteError("logits hold NaN or inf at the queries: the completeness check "
                             "would be NaN. Run the model in float32 or bfloat16.")
    checks.real_queries(adapter.cache_mask(cache), q)
    checks.token_ids(answers, (b, len(q)), d_vocab, "answers")
    if foils is not None:
        checks.token_ids(foils, (b, len(q)), d_vocab, "foils")
    adapter.check_residual_sum(cache, model, "Direct logit attribution")
    n_layers = model.n_layers
    w_ln, b_ln, centres = model.final_norm()
    device = logits.device
    answers = answers.to(device)
    foils = None if foils is None else foils.to(device)
    u, u_eff = direct_math.effective_directions(W_U, answers, foils, w_ln, centres)
    scale = adapter.read(cache, hook_names.final_scale(), model)[..., 0][:, q].double()
    heads = []
    comps = {"embed": direct_math.component_terms(
        adapter.read(cache, hook_names.resid_pre(0), model), u_eff, scale, q)}
    for layer in range(n_layers):
        pattern = adapter.read(cache, hook_names.pattern(layer), model)
        v = adapter.read(cache, hook_names.values(layer), model)
        heads.append(direct_math.head_key_terms(
            pattern, v, model.W_O(layer), u_eff, scale, q))
        comps[f"L{layer} b_O"] = direct_math.component_terms(model.b_O(layer), u_eff, scale, q).expand_as(scale)
        comps[f"L{layer} mlp"] = direct_math.component_terms(
            adapter.read(cache, hook_names.mlp_out(layer), model), u_eff, scale, q)
    b_U = b_U.double()
    beta = b_U[answers] - (b_U.mean() if foils is None else b_U[foils])
    if b_ln is not None:
        beta = beta + (u * b_ln.double()).sum(-1)
    comps["constant"] = beta.expand_as(scale)
    diff = direct_math.logit_difference(logits, q, answers, foils)
    return DirectLogitAttribution(
        torch.stack(heads, 2).cpu(), {k: v.cpu() for k, v in comps.items()}, diff.cpu(), tuple(q.tolist())
    )
