"""The movement truth (b) is where value-weighted attention is non-zero, by construction
(docs/groundtruth.md; scripts/movement_by_construction.py prints it for every program)."""

import math

import pytest

from cwlens.groundtruth import library
from cwlens.groundtruth.construction import separation


@pytest.mark.parametrize("name", ["frac_prevs", "successor", "hist"])
def test_value_weighted_attention_is_non_zero_exactly_on_the_movement(name):
    s = separation(library.load(name), n_inputs=24)
    assert s.n_inputs == s.separated == s.exact_support == 24
    assert s.worst_ratio < 1e-6
    if name == "hist":  # a SelectorWidth only: no Aggregate head
        assert math.isnan(s.attention_error)
    else:
        assert s.attention_error < 1e-6
