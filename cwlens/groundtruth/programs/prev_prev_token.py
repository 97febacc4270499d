"""prev_prev_token: the token two positions back, moved one position per attention layer.

Two ``lib.shift_by(1, ...)`` (tracr/compiler/lib.py, Apache-2.0, DeepMind) composed: layer
0's head copies x[i - 1] to position i, layer 1's head copies that again, so the
information crosses two attention layers (out[i] = x[i - 2]).
"""

from tracr.compiler import lib
from tracr.rasp import rasp

description = "a two-step composition: out[i] = x[i - 2], moved one position by each of two layers"
vocab = {"a", "b", "c"}
max_seq_len = 5
program = lib.shift_by(1, lib.shift_by(1, rasp.tokens)).named("prev_prev_token")
