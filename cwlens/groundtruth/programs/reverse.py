"""reverse: the input backwards (out[i] = x[length - 1 - i]).

Derived from tracr's ``lib.make_reverse`` (tracr/compiler/lib.py, Apache-2.0, DeepMind):
``length`` is a SelectorWidth (layer 0), ``opp_idx`` two MLPs, then one Aggregate reads
the token at the opposite position.
"""

from tracr.compiler import lib
from tracr.rasp import rasp

description = "the input backwards: a SelectorWidth (length), MLPs, then one copying head"
vocab = {"a", "b", "c", "d"}
max_seq_len = 5
program = lib.make_reverse(rasp.tokens)
