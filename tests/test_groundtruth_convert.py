"""Compiled tracr programs as cwlens models: the conversion is tracr's network, exactly.

Without jax: every shipped program's converted model reproduces tracr's own residual stream
(stored by scripts/compile_groundtruth.py) within 1e-5 and tracr's decoded outputs on all
256 shipped inputs; the cwlens identities hold on it. With tracr (the ``tracr`` extra):
tests/test_groundtruth_convert_tracr.py compiles programs here, random ones included.
"""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import cwlens
from cwlens.errors import (
    EmptyInputError,
    InputTooLongError,
    InvalidArgumentError,
    ShapeMismatchError,
    UnknownOptionError,
)
from cwlens.groundtruth import codec, decode, encode, library
from cwlens.groundtruth.codec import written

PROGRAMS = library.names()


def _meta(name):
    return json.loads((library.PROGRAMS / f"{name}.json").read_text())


def _same(ours, theirs, tol=1e-5, written=None):
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if written is not None and not written[i]:
            continue  # no value written: tracr's argmax picks among float noise
        if isinstance(a, float) or isinstance(b, float):
            assert abs(float(a) - float(b)) <= tol, (ours, theirs)
        else:
            assert a == b, (ours, theirs)


def test_eight_programs_are_shipped():
    assert len(PROGRAMS) >= 8
    for name in ("reverse", "sort", "hist", "frac_prevs", "prev_token", "prev_prev_token",
                 "successor", "first_two_equal"):
        assert name in PROGRAMS


@pytest.mark.parametrize("name", PROGRAMS)
def test_every_layer_equals_tracr(name):
    """Every residual (after each attention and each MLP block) equals tracr's within 1e-5."""
    program = library.load(name)
    meta = _meta(name)
    with np.load(library.PROGRAMS / f"{name}.npz") as z:
        checks = [z[f"check.{i}"] for i in range(meta["n_checked"])]
    model = program.model
    for tokens, theirs in zip(meta["inputs"], checks, strict=False):
        _, cache = model.run_with_cache(encode(model, tokens))
        ours = torch.stack([cache[f"blocks.{ly}.hook_resid_{w}"][0] for ly in range(model.cfg.n_layers)
                            for w in ("mid", "post")])
        torch.testing.assert_close(ours, torch.from_numpy(theirs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", PROGRAMS)
def test_decoded_outputs_equal_tracr(name):
    """On all 256 shipped inputs, batched by length, from the logits and from the residual:
    equal where tracr wrote a value, and nothing written where tracr wrote nothing."""
    program = library.load(name)
    meta = _meta(name)
    model = program.model
    by_length: dict[int, list[int]] = {}
    for i, tokens in enumerate(meta["inputs"]):
        by_length.setdefault(len(tokens), []).append(i)
    for rows in by_length.values():
        tokens = encode(model, [meta["inputs"][i] for i in rows])
        logits, cache = model.run_with_cache(tokens)
        final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
        mask = written(model, logits)
        for j, i in enumerate(rows):
            assert mask[j].tolist() == meta["tracr_written"][i]
            _same(decode(model, logits[j : j + 1]), meta["tracr_decoded"][i], written=mask[j])
            _same(decode(model, final[j]), meta["tracr_decoded"][i], written=mask[j])


@pytest.mark.parametrize("name", PROGRAMS)
def test_network_computes_the_program_where_it_has_an_output(name):
    """The decoded outputs equal the RASP program's where it has one (not None: tracr
    decodes "nothing" as the first output value)."""
    program = library.load(name)
    inputs = program.sample_inputs(256, seed=0)
    model = program.model
    for tokens, truth in zip(inputs[:64], program.truth(inputs[:64]), strict=True):
        got = decode(model, model(encode(model, tokens)))
        expect = truth.output
        keep = [i for i, v in enumerate(expect) if v is not None]
        _same([got[i] for i in keep], [expect[i] for i in keep], tol=1e-3)


def test_padded_batch_equals_single_runs():
    program = library.load("reverse")
    model = program.model
    short, long = ["BOS", "a", "b"], ["BOS", "c", "d", "a", "b", "a"]
    pad = model.tokenizer.pad_token_id
    tokens = torch.tensor([[*encode(model, short)[0].tolist(), pad, pad, pad], encode(model, long)[0].tolist()])
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1] * 6])
    logits = model(tokens, attention_mask=mask)
    torch.testing.assert_close(logits[0, :3], model(encode(model, short))[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[1], model(encode(model, long))[0], atol=1e-5, rtol=0)
    c_batch = cwlens.contribution_weights(cwlens.run_with_cache(model, tokens, attention_mask=mask)[1],
                                          model, 0, attention_mask=mask)
    c_alone = cwlens.contribution_weights(cwlens.run_with_cache(model, encode(model, short))[1], model, 0)
    torch.testing.assert_close(c_batch[0, :, :3, :3], c_alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", PROGRAMS)
def test_cwlens_identities_hold(name):
    """Contributions sum to 1 where the attention output is non-zero (0 where it is zero),
    heads x keys rebuild every layer's output, and the residual is the plain sum the
    circuit tools check."""
    program = library.load(name)
    model = program.model
    longest = max(program.sample_inputs(16, seed=1), key=len)
    tokens = encode(model, longest)
    _, cache = cwlens.run_with_cache(model, tokens, closure=True)
    closure = cwlens.closure(cache, model)
    assert closure.worst_relative_error < 1e-5
    for layer in range(model.cfg.n_layers):
        c = cwlens.token_contributions(cache, model, layer=layer)  # inter, heads summed
        o = cache[f"blocks.{layer}.hook_attn_out"][0] - model.blocks[layer].attn.b_O
        live = o.norm(dim=-1) > 0
        sums = c[0].sum(-1)
        torch.testing.assert_close(sums[live], torch.ones_like(sums[live]), atol=1e-4, rtol=0)
        assert bool((sums[~live] == 0).all())
    cwlens.engine.adapter.check_residual_sum(model.run_with_cache(tokens)[1], cwlens.wrap(model), "test")


def test_float64_copy_gives_the_same_numbers():
    model = library.load("sort").model
    tokens = encode(model, ["BOS", 3, 1, 2, 5])
    high = library.load("sort").model.to(torch.float64)
    assert high.cfg.dtype == torch.float64 and cwlens.wrap(high).device == "cpu"
    torch.testing.assert_close(high(tokens).float(), model(tokens), atol=1e-5, rtol=0)
    c32 = cwlens.contribution_weights(cwlens.run_with_cache(model, tokens)[1], model, 2)
    c64 = cwlens.contribution_weights(cwlens.run_with_cache(high, tokens)[1], high, 2)
    live = c64.abs().sum(-1) > 0
    torch.testing.assert_close(c32[live], c64[live].float(), atol=1e-4, rtol=0)


def test_tracr_model_is_a_bidirectional_model_without_norm():
    handle = cwlens.wrap(library.load("reverse").model)
    assert handle.generation == "hooked"
    assert handle.is_encoder  # bidirectional attention: no causal check applies
    assert not handle.normalized
    assert handle.residual_problems() == []
    assert handle.final_norm() == (None, None, False)


def test_importing_groundtruth_imports_no_jax():
    code = ("import sys, cwlens, cwlens.groundtruth\n"
            "cwlens.groundtruth.library.load('frac_prevs')\n"
            "print(','.join(m for m in ('jax', 'haiku', 'tracr') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# -- bad input: one clear error each, naming the value and the fix ------------------------
def test_token_outside_vocabulary():
    model = library.load("reverse").model
    with pytest.raises(InvalidArgumentError, match=r"token 'z' at position 2 is not in this program's vocabulary"):
        encode(model, ["BOS", "a", "z"])


def test_input_longer_than_max_seq_len():
    model = library.load("reverse").model
    with pytest.raises(InputTooLongError, match=r"6 tokens after the BOS, more than this program's max_seq_len 5"):
        encode(model, ["BOS", *"abcdab"])
    with pytest.raises(InputTooLongError, match="max_seq_len 5"):
        model(torch.zeros(1, 7, dtype=torch.long))


def test_input_without_bos_or_empty():
    model = library.load("reverse").model
    with pytest.raises(InvalidArgumentError, match=r"starts with 'a'.*BOS 'BOS'"):
        encode(model, ["a", "b"])
    with pytest.raises(EmptyInputError, match="empty"):
        encode(model, [])


def test_inputs_of_different_lengths_in_one_batch():
    model = library.load("reverse").model
    with pytest.raises(ShapeMismatchError, match=r"\[3, 4\] tokens"):
        encode(model, [["BOS", "a", "b"], ["BOS", "a", "b", "c"]])


def test_decode_of_a_wrong_tensor():
    model = library.load("reverse").model
    with pytest.raises(ShapeMismatchError, match="last axis has 7 entries"):
        decode(model, torch.zeros(1, 3, 7))


def test_unknown_program_names_the_shipped_ones():
    with pytest.raises(UnknownOptionError, match=r"no shipped program 'nope'.*'reverse'"):
        library.load("nope")


def test_truth_of_an_input_outside_the_vocabulary():
    program = library.load("sort")
    with pytest.raises(InvalidArgumentError, match="token 9"):
        program.truth([["BOS", 1, 9]])


def test_not_a_program_model():
    with pytest.raises(InvalidArgumentError, match="compiled program's model"):
        codec.encode(object(), ["BOS"])


def test_without_tracr_the_error_names_the_extra(tmp_path):
    """tracr made unimportable in a subprocess: a user's file, and the truth of an input
    that was not shipped, say what to install."""
    path = tmp_path / "mine.py"
    path.write_text("from tracr.rasp import rasp\nprogram = rasp.tokens\nvocab = {'a'}\nmax_seq_len = 2\n")
    code = textwrap.dedent(f'''
        import sys
        sys.modules["tracr"] = None
        from cwlens.errors import ModelNotAvailableError
        from cwlens.groundtruth import library
        for call in (lambda: library.from_file({str(path)!r}),
                     lambda: library.load("frac_prevs").truth([["BOS", "x", "x", "x", "x", "x"]])):
            try:
                call()
            except ModelNotAvailableError as err:
                print("ERR", err)
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("ERR")]
    assert len(lines) == 2 and all("pip install" in ln and "tracr" in ln for ln in lines), out.stdout


def test_docstring_examples_run():
    import doctest

    from cwlens.groundtruth import codec as codec_module
    from cwlens.groundtruth import library as library_module

    for module in (library_module, codec_module):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and (module is codec_module or result.attempted > 0)
