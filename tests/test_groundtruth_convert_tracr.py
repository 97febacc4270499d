"""Compiling with tracr (the ``tracr`` extra): from_tracr equals tracr's network on random
RASP programs, the truth computed with tracr equals the shipped one, and the errors of a
program tracr cannot compile or a file without one. Skipped where tracr is not installed.
"""

import random
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("tracr", reason="needs the tracr extra: pip install tracr-pypi==1.0.0")

from tracr.compiler import compiling, lib  # noqa: E402
from tracr.rasp import rasp  # noqa: E402

from cwlens.errors import InvalidArgumentError  # noqa: E402
from cwlens.groundtruth import decode, encode, from_tracr, library, load_weights, save  # noqa: E402
from cwlens.groundtruth.codec import written  # noqa: E402
from cwlens.groundtruth.compiler import compile_program, tracr_reference  # noqa: E402

VOCAB = {0, 1, 2, 3}
MAX_LEN = 4


def random_program(seed: int):
    """A random RASP program from a small grammar: Maps, SequenceMaps, categorical
    Aggregates whose selector picks at most one key (``key index == f(query)``), a
    SelectorWidth, and a numerical mean as the last step in some programs."""
    rng = random.Random(seed)

    def affine(m):
        a, b = rng.randint(1, 3), rng.randint(0, 3)
        return lambda x: (a * x + b) % m

    sops = [rasp.tokens, rasp.indices]
    reads_tokens = {id(rasp.tokens)}  # tracr compiles only programs that read the tokens

    def made(sop, *inputs):
        if any(id(i) in reads_tokens for i in inputs):
            reads_tokens.add(id(sop))
        sops.append(sop)

    for _ in range(rng.randint(2, 3)):
        op = rng.choice(["map", "sequence_map", "aggregate", "aggregate", "selector_width"])
        if op == "map":
            x = rng.choice(sops)
            made(rasp.Map(affine(4), x), x)
        elif op == "sequence_map":
            x, y = rng.sample(sops, 2)
            a, b, c = rng.randint(1, 3), rng.randint(1, 3), rng.randint(0, 3)
            made(rasp.SequenceMap(lambda u, v, a=a, b=b, c=c: (a * u + b * v + c) % 4, x, y), x, y)
        elif op == "aggregate":
            source, value = rng.choice(sops), rng.choice(sops)
            select = rasp.Select(rasp.indices, rasp.Map(affine(MAX_LEN), source), rasp.Comparison.EQ)
            made(rasp.Aggregate(select, value), source, value)
        else:
            comparison = rng.choice([rasp.Comparison.EQ, rasp.Comparison.LT, rasp.Comparison.GEQ])
            keys, queries = rng.choice(sops), rng.choice(sops)
            made(rasp.SelectorWidth(rasp.Select(keys, queries, comparison)), keys, queries)
    if id(sops[-1]) not in reads_tokens:
        made(rasp.SequenceMap(lambda u, v: (u + v) % 4, sops[-1], rasp.tokens), rasp.tokens)
    if rng.random() < 0.4:
        bools = rasp.numerical(rasp.Map(lambda x: 1 if x % 2 else 0, sops[-1]))
        select = rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.LEQ)
        return rasp.numerical(rasp.Aggregate(select, bools, default=0))
    return sops[-1]


def random_inputs(rng: random.Random, n: int) -> list[list]:
    return [["BOS", *(rng.choice(sorted(VOCAB)) for _ in range(rng.randint(1, MAX_LEN)))] for _ in range(n)]


def assert_equals_tracr(assembled, model, inputs):
    """Every layer's residual within 1e-5 of tracr's, the decoded outputs equal where tracr
    wrote a value, and nothing written where it wrote nothing."""
    for tokens, (theirs, decoded) in zip(inputs, tracr_reference(assembled, inputs), strict=True):
        _, cache = model.run_with_cache(encode(model, tokens))
        ours = torch.stack([cache[f"blocks.{ly}.hook_resid_{w}"][0] for ly in range(model.cfg.n_layers)
                            for w in ("mid", "post")])
        torch.testing.assert_close(ours, torch.from_numpy(theirs), atol=1e-5, rtol=0)
        logits = model(encode(model, tokens))
        theirs_written = written(model, torch.from_numpy(theirs[-1]) @ model.W_U)
        assert written(model, logits)[0].tolist() == theirs_written.tolist()
        for got, want, w in zip(decode(model, logits), decoded, theirs_written.tolist(), strict=True):
            if w and isinstance(want, float):
                assert abs(got - want) <= 1e-5
            elif w:
                assert got == want


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_programs_convert_exactly(seed):
    program = random_program(seed)
    assembled = compiling.compile_rasp_to_model(program, vocab=VOCAB, max_seq_len=MAX_LEN,
                                                compiler_bos="BOS")
    model = from_tracr(assembled, f"random{seed}")
    assert_equals_tracr(assembled, model, random_inputs(random.Random(seed), 12))


def test_causal_compilation_converts_exactly():
    assembled = compiling.compile_rasp_to_model(lib.make_frac_prevs(rasp.tokens == 1), vocab=VOCAB,
                                                max_seq_len=MAX_LEN, compiler_bos="BOS", causal=True)
    model = from_tracr(assembled, "frac_prevs_causal")
    assert model.cfg.attention_dir == "causal"
    assert_equals_tracr(assembled, model, random_inputs(random.Random(5), 8))


def test_save_and_load_weights_round_trip(tmp_path):
    assembled, _ = compile_program(lib.make_hist(), {"a", "b"}, 3)
    model = from_tracr(assembled, "hist")
    save(model, tmp_path / "hist")
    again = load_weights(tmp_path / "hist")
    tokens = encode(model, ["BOS", "a", "b", "a"])
    torch.testing.assert_close(again(tokens), model(tokens), atol=0, rtol=0)
    assert again.layout == model.layout


def test_float64_conversion_matches_float32():
    assembled, _ = compile_program(lib.make_hist(), {"a", "b"}, 3)
    tokens = ["BOS", "a", "b", "b"]
    low, high = from_tracr(assembled), from_tracr(assembled, dtype=torch.float64)
    torch.testing.assert_close(high(encode(high, tokens)).float(), low(encode(low, tokens)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", library.names())
def test_truth_with_tracr_equals_the_shipped_truth(name):
    shipped = library.load(name)
    inputs = shipped.sample_inputs(256, seed=0)[:6]
    fresh = library.load(name)
    fresh._shipped.clear()  # computed again with tracr's evaluator
    for a, b in zip(shipped.truth(inputs), fresh.truth(inputs), strict=True):
        assert a.output == b.output
        for field in ("dependence", "movement", "fallback", "selected"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field


def test_truth_of_a_new_input_is_computed():
    program = library.load("frac_prevs")
    (truth,) = program.truth([["BOS", "x", "w", "x"]])
    assert truth.output == ["BOS", 1.0, 0.5, 2 / 3]
    # the mean at position 3 reads keys 1..3; key 2 ("w") is 0: selected, not moved
    assert truth.selected[1, 0, 3, 1:].tolist() == [True, True, True]
    assert truth.movement[1, 0, 3, 1:].tolist() == [True, False, True]
    assert truth.dependence[3, 1:].tolist() == [True, True, True]


def test_successor_falls_back_to_bos():
    program = library.load("successor")
    (truth,) = program.truth([["BOS", 3, 1, 4, 8]])
    assert truth.output == ["BOS", 2, None, None, None]  # 3 -> 4 at index 2 (position 3)
    assert truth.fallback[0, 0].tolist() == [False, False, True, True, True]
    assert truth.movement[0, 0, 1].tolist() == [False, False, False, True, False]
    attention = program.model.run_with_cache(encode(program.model, truth.tokens))[1]["blocks.0.attn.hook_pattern"]
    assert bool((attention[0, 0, 2:, 0] > 0.99).all())  # the fall-back: attention on the BOS


# -- bad input --------------------------------------------------------------------------
def test_a_program_tracr_cannot_compile():
    unsupported = rasp.numerical(rasp.Aggregate(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.EQ),
                                                rasp.tokens, default=0))  # numerical mean of categorical tokens
    with pytest.raises(InvalidArgumentError, match="tracr cannot compile this program"):
        compile_program(unsupported, {1, 2}, 3)


def test_a_program_that_reads_no_tokens():
    with pytest.raises(InvalidArgumentError, match="tracr cannot compile this program.*rasp.tokens"):
        compile_program(rasp.Map(lambda i: i % 2, rasp.indices), {1, 2}, 3)


def test_vocab_with_the_bos_or_of_the_wrong_kind():
    with pytest.raises(InvalidArgumentError, match="vocab holds 'BOS'"):
        compile_program(lib.make_hist(), {"a", "BOS"}, 3)
    with pytest.raises(InvalidArgumentError, match="vocab must be a set of tokens"):
        compile_program(lib.make_hist(), "abc", 3)
    with pytest.raises(InvalidArgumentError, match=r"max_seq_len must be a positive int .*; got 0"):
        compile_program(lib.make_hist(), {"a"}, 0)


def test_from_tracr_of_something_else():
    with pytest.raises(InvalidArgumentError, match="from_tracr takes tracr's assembled model"):
        from_tracr(lib.make_hist())


def test_a_file_that_defines_no_program(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from tracr.rasp import rasp\nvocab = {'a'}\nmax_seq_len = 3\nprogam = rasp.tokens\n")
    with pytest.raises(InvalidArgumentError, match=r"mine.py defines no program \(it defines .*'progam'"):
        library.from_file(path)
    with pytest.raises(InvalidArgumentError, match="no program file"):
        library.from_file(tmp_path / "missing.py")


def test_a_users_program_file_compiles(tmp_path):
    path = tmp_path / "copy_first.py"
    path.write_text(textwrap.dedent('''
        from tracr.rasp import rasp
        vocab = {"a", "b"}
        max_seq_len = 3
        program = rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 0), rasp.tokens)
        def sample_inputs(n, seed):
            return [["a", "b"]] * n
    '''))
    program = library.from_file(path)
    assert program.name == "copy_first" and program.components == frozenset({("attn", 0, 0)})
    assert program.sample_inputs(2, 0) == [["BOS", "a", "b"]] * 2
    (truth,) = program.truth([["BOS", "b", "a", "a"]])
    assert truth.output == ["BOS", "b", "b", "b"]
    assert truth.movement[0, 0, 1:, 1].all() and truth.dependence[1:, 1].all()
    assert not truth.dependence[:, 2:].any()
    assert np.array_equal(decode(program.model, program.model(encode(program.model, truth.tokens))),
                          truth.output)
