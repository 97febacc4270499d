"""successor: where the token one larger than this one sits (its index), if anywhere.

cwlens' own program (written for tracr's compiler). One categorical Aggregate of
``indices`` over ``Select(tokens, tokens, k == q + 1)``. Inputs hold distinct tokens
drawn from 1..8, so most queries find no successor: the query then matches nothing and
attends to the BOS (a sink with no value): attention 1, nothing moved.
"""

from tracr.rasp import rasp

description = "queries that often match nothing: attention falls back to a value-less BOS"
vocab = set(range(1, 9))
max_seq_len = 5
sampling = {"distinct": True}
successor = rasp.Select(rasp.tokens, rasp.tokens, lambda k, q: k == q + 1).named("is_successor")
program = rasp.Aggregate(successor, rasp.indices).named("successor")
