"""first_two_equal: whether the input's first two tokens are equal (at every position).

cwlens' own program (written for tracr's compiler). Two Aggregates that both read the
input are placed in the same layer, so layer 0 has two heads: one copies the first token
to every position, one the second; an MLP compares what they wrote. Inputs hold at least
two tokens, so both heads always find their key (no None reaches the MLP).
"""

from tracr.rasp import rasp

description = "two heads in one layer (they copy the first and the second token), compared by an MLP"
vocab = {"a", "b", "c"}
max_seq_len = 5
sampling = {"min_length": 2}
first = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 0),
                       rasp.tokens).named("first")
second = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 1),
                        rasp.tokens).named("second")
program = rasp.SequenceMap(lambda a, b: a == b, first, second).named("first_two_equal")
