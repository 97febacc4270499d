"""Every importance method cwlens has, computed on a batch of equal-length inputs, at the
three levels a compiled program's ground truth is defined on (:mod:`cwlens.groundtruth.truth`).

``layer`` (against the per-layer *movement*, truth (b)): one score per entry ``(layer,
head, query, key)``, ``[batch, layer, head_index, query_pos, key_pos]``: the metrics of
:data:`cwlens.core.metrics.REGISTRY` -- attention ``a_ij``, value-weighted, its
output-normalised variant, contribution weights ``c_ij`` of the head's own output
(``contribution_intra``) and of the layer's (``contribution``), ``|c_ij|``, ALTI, ALTI of
the attention output, and attention x gradient (signed and absolute). Where a metric has
a ``kind``, it is the layer's output (``"inter"``, cwlens's default) unless the name says
``_intra``.

``input`` (against *input dependence*, truth (a)): one score per ``(output position,
input position)``, ``[batch, query_pos, key_pos]``: attention rollout (Abnar & Zuidema
2020, :mod:`cwlens.core.rollout`), the token flow of contribution weights under each of its
three rules (:mod:`cwlens.circuits.flow_math`), and captum's input attributions of the
output at each position with respect to the residual stream entering layer 0 (the token
plus position embedding, one-hot in a compiled model): saliency (``sum_d |dy/dx_jd|``),
input x gradient and integrated gradients (``|sum_d attribution_jd|``; baseline: the
zero embedding, 32 steps).

``component`` (against the compiled graph's components, truth (c)): one score per head,
``[batch, layer, head_index]``, each the mean over the output positions ``q`` of a
per-query magnitude: the attention the head puts off BOS (``1 - a_q0``, attention's view
of "the head is at work"), ``|sum_j c_qj^h|`` (the head's contribution share of its
layer's output, :func:`cwlens.circuits.head_scores`), ``|DLA|`` (the head's direct effect
on the output, :mod:`cwlens.circuits.direct_math`) and ``|Δy|`` of activation patching
(the head's ``hook_z`` taken from a corrupted input of the same length,
:func:`cwlens.circuits.patching.replace_heads_hook`).

*The output* ``y_q`` at position ``q`` -- what the gradients, DLA and patching read -- is
the logit of the model's own output there: ``logits[q, argmax]``. For a categorical
program that is the decoded output's logit (its unembedding column as the direction); a
numerical program has one output dimension, so it is the output value itself, read along
the output value's residual direction. Gradients are of the sum of ``y_q`` over the output
positions ``q >= 1`` (BOS is not an output).

Each method is one :class:`Method` in :data:`METHODS`; the first of each level is its
*reference*, the attention-based view the others are tested against.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

Level = Literal["layer", "input", "component"]
LEVELS: tuple[Level, ...] = ("layer", "input", "component")
IG_STEPS = 32


@dataclass(frozen=True)
class Method:
    """One scored method.

    Attributes:
        name: the key in tables and ``--json``.
        level: ``"layer"``, ``"input"`` or ``"component"`` (the truth it is scored against).
        label: a short label for tables and figures.
        math: one line of what the score is.
    """

    name: str
    level: Level
    label: str
    math: str


def _layer(name: str, label: str, math: str) -> Method:
    return Method(name, "layer", label, math)


METHODS: tuple[Method, ...] = (
    _layer("attention", "attention", "a_ij"),
    _layer("value_weighted", "value-weighted", "a_ij ||v~_j||"),
    _layer("value_weighted_output_normalized", "vw output-norm.", "a_ij ||v~_j|| / ||o_i||"),
    _layer("contribution_intra", "contribution (intra)", "<o_i^h, a_ij v~_j> / ||o_i^h||^2"),
    _layer("contribution", "contribution (inter)", "<o_i, a_ij v~_j> / ||o_i||^2"),
    _layer("contribution_abs", "|contribution|", "|c_ij| (inter)"),
    _layer("alti", "ALTI", "Ferrando et al. 2022, residual as one part"),
    _layer("alti_attention", "ALTI (attn output)", "L1 proximity to o_i, no residual"),
    _layer("attention_gradient", "attn x grad", "a_ij dy/da_ij"),
    _layer("attention_gradient_abs", "|attn x grad|", "|a_ij dy/da_ij|"),
    Method("rollout", "input", "attention rollout", "prod_l (0.5 mean_h A_l + 0.5 I)"),
    Method("flow_projection", "input", "token flow (projection)", "contribution flow, rule projection"),
    Method("flow_signed", "input", "token flow (signed)", "contribution flow, rule signed"),
    Method("flow_absolute", "input", "token flow (absolute)", "contribution flow, rule absolute"),
    Method("saliency", "input", "saliency", "sum_d |dy_q/dx_jd|"),
    Method("input_x_gradient", "input", "input x gradient", "|sum_d x_jd dy_q/dx_jd|"),
    Method("integrated_gradients", "input", "integrated gradients",
           f"|sum_d IG_jd|, zero baseline, {IG_STEPS} steps"),
    Method("attention_off_bos", "component", "attention off BOS", "mean_q (1 - a_q0^h)"),
    Method("contribution_share", "component", "contribution share", "mean_q |sum_j c_qj^h|"),
    Method("direct_logit_attribution", "component", "direct logit attr.", "mean_q |<o_q^h, u_q>|"),
    Method("activation_patching", "component", "activation patching",
           "mean_q |y_q(clean) - y_q(z^h from a corrupted input)|"),
)
BY_NAME: dict[str, Method] = {m.name: m for m in METHODS}


def of_level(level: Level) -> tuple[Method, ...]:
    """The methods scored against one level's truth, the reference first."""
    return tuple(m for m in METHODS if m.level == level)


def reference(level: Level) -> str:
    """The attention-based method the others of ``level`` are compared with."""
    return of_level(level)[0].name


# -- the output --------------------------------------------------------------------------
def answers_of(logits: torch.Tensor) -> torch.Tensor:
    """``[batch, pos]`` the index of the model's output at each position (argmax; 0 for a
    numerical program's single output dimension)."""
    return logits.argmax(-1)


def outputs(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """``y``: ``[batch, pos]``, the logit of ``answers`` at each position."""
    return logits.gather(-1, answers[..., None].to(logits.device))[..., 0]


def output_loss(answers: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``-sum_{b, q >= 1} y_bq``: with it, ``-a dL/da`` (:func:`~cwlens.engine.gradients.attention_gradient`)
    is ``a dy/da``, attention x gradient of the outputs."""

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return -outputs(logits, answers)[:, 1:].sum()

    return loss
