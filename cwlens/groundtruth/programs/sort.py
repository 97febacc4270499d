"""sort: the tokens in increasing order (ties kept in input order).

Derived from tracr's ``lib.make_sort`` (tracr/compiler/lib.py, Apache-2.0, DeepMind):
keys made unique by a SequenceMap (``x + i / max_seq_len``), a SelectorWidth counts the
smaller keys (each token's target position), one Aggregate moves each token there.
"""

from tracr.compiler import lib
from tracr.rasp import rasp

description = "the tokens sorted: a SelectorWidth finds each target position, one head moves the token"
vocab = {1, 2, 3, 4, 5}
max_seq_len = 5
program = lib.make_sort(rasp.tokens, rasp.tokens, max_seq_len=max_seq_len, min_key=1)
