"""hist: how often each position's token occurs in the input.

From tracr's ``lib.make_hist`` (tracr/compiler/lib.py, Apache-2.0, DeepMind): one
SelectorWidth over ``Select(tokens, tokens, EQ)``. Tracr computes a SelectorWidth by
attending to the selected keys *and* the BOS: the BOS carries the only value, the selected
keys dilute it (1 / (width + 1)), and an MLP reads the width back.
"""

from tracr.compiler import lib

description = "each token's count: a SelectorWidth head (the BOS carries the value, matches dilute it)"
vocab = {"a", "b", "c"}
max_seq_len = 5
program = lib.make_hist()
