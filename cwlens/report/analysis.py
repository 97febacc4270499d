"""Everything the report shows about one text, computed from one cached forward pass."""

from dataclasses import dataclass, field

import torch

import cwlens
from cwlens import validation
from cwlens.core.sinks import sink_rate


@dataclass(frozen=True)
class TextAnalysis:
    """Per-layer attention vs contribution of one text (batch of 1), as CPU tensors.

    ``attention``/``contribution``/``relative_norm``/``cosine``: ``[layer, head, query, key]``
    (inter-head: o is the layer's attention output). ``sink_rate``: ``[layer, head]``.
    """

    model_name: str
    text: str
    str_tokens: list[str]
    attention: torch.Tensor
    contribution: torch.Tensor
    relative_norm: torch.Tensor
    cosine: torch.Tensor
    sink_rate: torch.Tensor
    closure_error: tuple[float, ...]
    sum_error: float
    notes: list[str] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return self.attention.shape[0]

    @property
    def n_heads(self) -> int:
        return self.attention.shape[1]

    def token_contribution(self) -> torch.Tensor:
        """``[layer, query, key]``: heads summed (each row sums to 1)."""
        return self.contribution.sum(1)

    def top_tokens(self, layer: int, query: int, k: int = 5) -> list[tuple[int, str, float, float]]:
        """Top-k keys by |token contribution| for one query: (key, token, contribution, mean attention)."""
        row = self.token_contribution()[layer, query]
        att = self.attention[layer, :, query].mean(0)
        order = row.abs().argsort(descending=True)[:k].tolist()
        return [(j, self.str_tokens[j], float(row[j]), float(att[j])) for j in order]

    def summary_lines(self, k: int = 3) -> list[str]:
        q = len(self.str_tokens) - 1
        lines = [
            f"{self.model_name}: {len(self.str_tokens)} tokens, {self.n_layers} layers x {self.n_heads} heads",
            f"checks: weights sum to 1 within {self.sum_error:.1e}; heads x keys rebuild the "
            f"attention output within {max(self.closure_error):.1e} (relative)",
            f"sink heads (mean attention on the first token > 0.3): "
            f"{int((self.sink_rate > 0.3).sum())} of {self.sink_rate.numel()}",
            f"top contributing tokens for the last query ({self.str_tokens[q]!r}):",
        ]
        for layer in _spread(self.n_layers, 4):
            tops = ", ".join(f"{t!r} {c:+.2f}" for _, t, c, _ in self.top_tokens(layer, q, k))
            lines.append(f"  layer {layer:>2}: {tops}")
        return lines


def _spread(n: int, k: int) -> list[int]:
    return sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(min(k, n))})


def analyze_text(model, text: str, model_name: str = "model", max_tokens: int = 64) -> TextAnalysis:
    """Run the model once on ``text`` (first ``max_tokens`` tokens) and collect every measure."""
    validation.text(text)
    validation.max_tokens(max_tokens)
    tokens = model.to_tokens(text)[:, :max_tokens]
    str_tokens = [str(t) for t in model.to_str_tokens(tokens[0])]
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, closure=True)
        parts = cwlens.decompose(cache, model, kind="inter")
        closure = cwlens.closure(cache, model)
    sums = parts.contribution.sum((2, 4))
    return TextAnalysis(
        model_name=model_name,
        text=text,
        str_tokens=str_tokens,
        attention=parts.attention[:, 0].cpu(),
        contribution=parts.contribution[:, 0].cpu(),
        relative_norm=parts.relative_norm[:, 0].cpu(),
        cosine=parts.cosine[:, 0].cpu(),
        sink_rate=sink_rate(parts.attention[:, 0]).cpu(),
        closure_error=closure.relative_error,
        sum_error=float((sums - 1).abs().max()),
    )
