"""prev_token: copy the previous token (out[i] = x[i - 1]; nothing at the first position).

Uses tracr's ``lib.shift_by`` (tracr/compiler/lib.py, Apache-2.0, DeepMind): one
categorical Aggregate over ``Select(indices, indices, q == k + 1)``. The first position's
query matches no key and falls back to the BOS.
"""

from tracr.compiler import lib
from tracr.rasp import rasp

description = "copy from offset 1: one head; the first query matches nothing (BOS fall-back)"
vocab = {"a", "b", "c"}
max_seq_len = 5
program = lib.shift_by(1, rasp.tokens)
