"""A compiled program written by hand, so the scoring tests know every number: "gate".

Program (RASP-like): ``out_q = "a" if q is odd and tokens[1] == "a" else "none"`` for every
position ``q >= 1``. One layer, two heads, no MLP:

* head 0: an odd query selects the key at index 1 when its token is ``a`` (score
  ``beta``); the BOS gets ``beta / 2`` from every query (tracr's fall-back), every other
  key ``0`` or less. Its value moves ``tokens:a`` into ``out:a``; the BOS's value is zero.
  Even queries, and every query when ``tokens[1] == "b"``, fall back to BOS: attention
  ~1 on BOS, nothing moved.
* head 1 has zero weights: uniform attention, zero output (not a component).
* the unembedding reads ``out:a`` for ``"a"`` and ``0.5 one`` for ``"none"``.

Truth: dependence ``[q, 1]`` for odd ``q``; movement ``(0, 0, q, 1)`` for odd ``q`` when
``tokens[1] == "a"``, every other row of head 0 a fall-back; components ``{("attn", 0, 0)}``.
"""

import random
from dataclasses import dataclass, field

import numpy as np
import torch

from cwlens.groundtruth.convert import TracrLayout, build

BETA = 100.0
MAX_LEN = 4
LABELS = ("tokens:a", "tokens:b", *(f"indices:{i}" for i in range(MAX_LEN + 1)), "one", "out:a",
          "tokens:BOS")
DIM = {name: i for i, name in enumerate(LABELS)}
INPUT_TOKENS = ("BOS", "pad", "a", "b")


@dataclass(frozen=True)
class GateTruth:
    tokens: list
    dependence: torch.Tensor
    movement: torch.Tensor
    fallback: torch.Tensor
    output: list


def gate_model(dtype=torch.float32):
    d = len(LABELS)
    w = {"W_E": np.zeros((len(INPUT_TOKENS), d), np.float32),
         "W_pos": np.zeros((MAX_LEN + 1, d), np.float32),
         "W_U": np.zeros((d, 2), np.float32)}
    for i, t in enumerate(INPUT_TOKENS):
        w["W_E"][i, DIM["one"]] = 1.0
        if t in ("a", "b"):
            w["W_E"][i, DIM[f"tokens:{t}"]] = 1.0
        if t == "BOS":
            w["W_E"][i, DIM["tokens:BOS"]] = 1.0
    for p in range(MAX_LEN + 1):
        w["W_pos"][p, DIM[f"indices:{p}"]] = 1.0
    w["W_U"][DIM["out:a"], 0] = 1.0
    w["W_U"][DIM["one"], 1] = 0.5
    h, dh = 2, 2
    for name, shape in (("W_Q", (h, d, dh)), ("W_K", (h, d, dh)), ("W_V", (h, d, dh)),
                        ("b_Q", (h, dh)), ("b_K", (h, dh)), ("b_V", (h, dh)), ("W_O", (h, dh, d)),
                        ("b_O", (d,)), ("W_in", (d, 1)), ("b_in", (1,)), ("W_out", (1, d)),
                        ("b_out", (d,))):
        w[f"0.{name}"] = np.zeros(shape, np.float32)
    scale = np.sqrt(dh)  # the network divides the scores by sqrt(d_head)
    for p in range(1, MAX_LEN + 1, 2):  # dim 0: odd queries read "index 1 holds a"
        w["0.W_Q"][0, DIM[f"indices:{p}"], 0] = scale
    w["0.W_K"][0, DIM["indices:1"], 0] = BETA
    w["0.W_K"][0, DIM["tokens:a"], 0] = BETA
    w["0.W_K"][0, DIM["one"], 0] = -BETA
    w["0.W_K"][0, DIM["tokens:BOS"], 0] = BETA  # the BOS: 0 on dim 0
    w["0.W_Q"][0, DIM["one"], 1] = scale  # dim 1: every query gives the BOS beta / 2
    w["0.W_K"][0, DIM["tokens:BOS"], 1] = BETA / 2
    w["0.W_V"][0, DIM["tokens:a"], 0] = 1.0
    w["0.W_O"][0, 0, DIM["out:a"]] = 1.0
    layout = TracrLayout(LABELS, INPUT_TOKENS, "BOS", "pad", ("a", "none"), "out", MAX_LEN, False)
    return build(w, layout, "gate", dtype)


def gate_truth(tokens: list) -> GateTruth:
    n = len(tokens)
    hit = n > 1 and tokens[1] == "a"
    odd = torch.arange(n) % 2 == 1
    dependence = torch.zeros(n, n, dtype=torch.bool)
    dependence[odd, 1] = True
    movement = torch.zeros(1, 2, n, n, dtype=torch.bool)
    fallback = torch.zeros(1, 2, n, dtype=torch.bool)
    fallback[0, 0, 1:] = True
    if hit:
        movement[0, 0, odd, 1] = True
        fallback[0, 0, odd] = False
    output = ["BOS", *("a" if hit and q % 2 == 1 else "none" for q in range(1, n))]
    return GateTruth(list(tokens), dependence, movement, fallback, output)


@dataclass(frozen=True)
class GateProgram:
    """Duck-types :class:`cwlens.groundtruth.library.CompiledProgram`."""

    name: str = "gate"
    model: object = field(default_factory=gate_model)
    vocab: tuple = ("a", "b")
    max_seq_len: int = MAX_LEN
    bos: str = "BOS"
    source: str = "out = 'a' if q is odd and tokens[1] == 'a' else 'none'"
    description: str = "a hand-compiled gate"
    components: frozenset = frozenset({("attn", 0, 0)})

    def sample_inputs(self, n: int, seed: int = 0) -> list[list[str]]:
        rng = random.Random(seed)
        return [["BOS", *(rng.choice(self.vocab) for _ in range(rng.randint(1, MAX_LEN)))]
                for _ in range(n)]

    def truth(self, inputs):
        return [gate_truth(list(t)) for t in inputs]
