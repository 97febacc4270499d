"""frac_prevs: the fraction of positions up to this one whose token is "x".

From tracr's ``lib.make_frac_prevs`` (tracr/compiler/lib.py, Apache-2.0, DeepMind): an MLP
makes ``tokens == "x"`` numerical (1 or 0), one numerical Aggregate averages it over
``Select(indices, indices, LEQ)``. Keys that are not "x" have value 0: they move nothing,
yet they shape the output through the mean's normalisation.
"""

from tracr.compiler import lib
from tracr.rasp import rasp

description = "a numerical mean: zero-valued keys move nothing but shape the output through the normalisation"
vocab = {"w", "x", "y", "z"}
max_seq_len = 5
program = lib.make_frac_prevs(rasp.tokens == "x")
