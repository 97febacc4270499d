"""Property test (hypothesis): random malformed arguments to the public functions and the
command-line options end in a ``CwlensError`` (API) or in one ``error:`` line with exit 2
or 1 (command line) — never another exception type, never silent acceptance.

Each strategy draws only values the docs call invalid for that argument, so "no error"
is a failure too. The functions are called without the suite's run-time type checker
(``inspect.unwrap``; see tests/_typecheck.py): the property is about what a user gets.
Few examples, one tiny model: the file runs in well under a minute.
"""

import inspect
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cwlens
from cwlens import reducers
from cwlens.cli.main import main
from cwlens.errors import CwlensError
from cwlens.testing import save_tiny
from tests._typecheck import unchecked

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny("llama", tmp_path_factory.mktemp("prop"))
    model = cwlens.load_model(str(path), device="cpu")
    return model, model.to_tokens("the cat sat on the mat"), path


def raw(fn):
    return unchecked(fn)


# -- values the docs call invalid ----------------------------------------------------
junk = st.sampled_from([None, "", "  ", "abc", b"x", 1.5, math.nan, math.inf, -math.inf, True,
                        False, [], {}, object(), (), [None], {"a": 1}])
not_positive_int = st.one_of(st.integers(max_value=0), st.floats(allow_nan=True),
                             st.sampled_from([None, True, "3", [2], "", math.inf]))
not_a_flag = st.one_of(st.integers(), st.floats(), st.text(max_size=4), st.none(), st.just([]))
not_a_metric = st.text(max_size=12).filter(
    lambda t: t not in ("attention", "value_weighted", "value_weighted_output_normalized",
                        "contribution", "contribution_abs", "alti"))
bad_layer_items = st.one_of(st.floats(allow_nan=True), st.text(min_size=1, max_size=3),
                            st.none(), st.booleans())
bad_layer_list = st.one_of(st.lists(bad_layer_items, min_size=1, max_size=3), st.just([]),
                           st.text(max_size=3), st.just([0, 0]))
bad_pairs = st.one_of(
    st.just([]), st.lists(st.tuples(st.integers(0, 1)), min_size=1, max_size=2),
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=2),
    st.lists(st.tuples(st.floats(), st.integers(0, 1)), min_size=1, max_size=2), junk.filter(
        lambda v: not isinstance(v, list | tuple) or len(v) == 0))


def refuses(call) -> None:
    """``call()`` raises a CwlensError (anything else, or nothing, fails the property)."""
    with pytest.raises(CwlensError):
        call()


# -- reducer constructors ---------------------------------------------------------------
def make(cls, **kwargs):
    obj = cls.__new__(cls)
    raw(cls.__init__)(obj, **kwargs)
    return obj


@SETTINGS
@given(case=st.one_of(
    st.tuples(st.just(reducers.TopK), st.just("k"), not_positive_int),
    st.tuples(st.just(reducers.TopK), st.just("metric"), not_a_metric),
    st.tuples(st.just(reducers.TopK), st.just("by_abs"), not_a_flag),
    st.tuples(st.just(reducers.TopK), st.just("sum_heads"), not_a_flag),
    st.tuples(st.just(reducers.TopK), st.just("name"), st.sampled_from(["", "  ", 3, b"x"])),
    st.tuples(st.just(reducers.ColumnSums), st.just("metric"), not_a_metric),
    st.tuples(st.just(reducers.ColumnSums), st.just("sum_heads"), not_a_flag),
    st.tuples(st.just(reducers.TokenLevel), st.just("layers"), bad_layer_list),
    st.tuples(st.just(reducers.TokenLevel), st.just("metric"), not_a_metric),
    st.tuples(st.just(reducers.HeadSummary), st.just("name"), st.sampled_from(["", None, 0, []])),
    st.tuples(st.just(reducers.FullMatrices), st.just("pairs"), bad_pairs),
))
def test_reducer_constructors_refuse_malformed_arguments(case):
    cls, name, value = case
    kwargs = {name: value}
    if cls is reducers.FullMatrices and name != "pairs":
        kwargs["pairs"] = [(0, 0)]
    refuses(lambda: make(cls, **kwargs))


# -- the stream functions --------------------------------------------------------------
def _fn(layer, w):
    return None


bad_inputs = st.one_of(
    junk.filter(lambda v: not isinstance(v, str) or not v.strip()),
    st.lists(st.sampled_from(["", " ", "\n"]), min_size=1, max_size=3),
    st.builds(lambda n: torch.full((1, 3), n, dtype=torch.long),
              st.one_of(st.integers(max_value=-1), st.integers(min_value=10_000, max_value=2**40))),
    st.sampled_from([torch.ones(1, 3), torch.ones(1, 3, dtype=torch.float16), torch.ones(1, 3).bool(),
                     torch.ones(1, 1, 3, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long)]),
)  # (more tokens than n_ctx is no error for this rotary model: test_bad_input_round2.py)


@SETTINGS
@given(which=st.sampled_from(["stream", "stream_geometry", "stream_reduce", "run_with_cache"]),
       value=bad_inputs)
def test_stream_functions_refuse_malformed_input(tiny, which, value):
    model = tiny[0]
    calls = {
        "stream": lambda: raw(cwlens.stream)(model, value, _fn),
        "stream_geometry": lambda: raw(cwlens.stream_geometry)(model, value, _fn),
        "stream_reduce": lambda: raw(cwlens.stream_reduce)(model, value, [reducers.HeadSummary()]),
        "run_with_cache": lambda: raw(cwlens.run_with_cache)(model, value),
    }
    refuses(calls[which])


@SETTINGS
@given(case=st.one_of(
    st.tuples(st.just("reducers"), st.one_of(junk, st.lists(junk, min_size=1, max_size=2)).filter(
        lambda v: not (isinstance(v, dict) and v))),
    st.tuples(st.just("query_block"), not_positive_int.filter(lambda v: v is not None)),
    st.tuples(st.just("closure"), not_a_flag),
    st.tuples(st.just("kind"), st.text(max_size=6).filter(lambda t: t not in ("inter", "intra"))),
    st.tuples(st.just("layers"), st.one_of(st.integers(min_value=2), st.integers(max_value=-3),
                                           bad_layer_items.filter(lambda v: v is not None))),
    st.tuples(st.just("token_level"), st.lists(st.integers(2, 9), min_size=1, max_size=2, unique=True)),
    st.tuples(st.just("pair_head"), st.integers(4, 99)),
))
def test_stream_reduce_refuses_malformed_arguments(tiny, case):
    model, tokens, _ = tiny
    what, value = case
    kwargs: dict = {"reducers": [reducers.HeadSummary()]}
    if what == "token_level":
        kwargs["reducers"] = [reducers.TokenLevel([0, *value])]
    elif what == "pair_head":
        kwargs["reducers"] = [reducers.FullMatrices([(0, value)])]
    else:
        kwargs[what] = value
    refuses(lambda: raw(cwlens.stream_reduce)(model, tokens, **kwargs))


# -- export and circuits ------------------------------------------------------------------
@SETTINGS
@given(case=st.one_of(
    st.tuples(st.just("texts"), st.one_of(st.just([]), st.just("one text"),
                                          st.lists(st.sampled_from(["", " "]), min_size=1, max_size=2))),
    st.tuples(st.just("k"), not_positive_int.filter(lambda v: v is not None)),
    st.tuples(st.just("max_tokens"), st.one_of(st.integers(max_value=0), st.floats(), st.just("8"))),
    st.tuples(st.just("token_layers"), st.one_of(st.lists(st.integers(2, 50), min_size=1, max_size=2),
                                                 st.lists(st.integers(max_value=-3), min_size=1, max_size=2),
                                                 st.just("0"))),
    st.tuples(st.just("metrics"), st.one_of(st.just([]), st.lists(not_a_metric, min_size=1, max_size=2))),
    st.tuples(st.just("fmt"), st.text(max_size=5).filter(lambda t: t not in ("csv", "parquet"))),
    st.tuples(st.just("text_ids"), st.sampled_from([[], ["a", "b"], ["a", "a", "b"]])),
))
def test_export_refuses_malformed_arguments(tiny, tmp_path_factory, case):
    from cwlens.report.export import export_texts

    model = tiny[0]
    name, value = case
    kwargs = {"texts": ["the cat sat"], "out_dir": tmp_path_factory.mktemp("exp"), "fmt": "csv",
              name: value}
    refuses(lambda: raw(export_texts)(model, **kwargs))


@SETTINGS
@given(case=st.one_of(
    st.tuples(st.just("ioi"), st.just("n_prompts"), st.one_of(st.integers(max_value=1), st.floats())),
    st.tuples(st.just("ioi"), st.just("seed"), st.one_of(st.integers(max_value=-1), st.floats(), st.text(max_size=2))),
    st.tuples(st.just("ioi"), st.just("names"), st.one_of(st.lists(st.just("Mary"), max_size=1),
                                                          st.just("Mary"), st.just(["Mary", ""]))),
    st.tuples(st.just("induction"), st.just("length"), st.one_of(st.integers(max_value=1),
                                                                 st.integers(min_value=64, max_value=10_000))),
    st.tuples(st.just("induction"), st.just("n_prompts"), not_positive_int),
    st.tuples(st.just("capitals"), st.just("template"), st.one_of(st.text(max_size=8).filter(
        lambda t: t.count("{}") != 1), st.just("{} and {}"))),
    st.tuples(st.sampled_from(["ioi", "induction", "capitals"]), st.sampled_from(["prompts", "k", "model2"]),
              st.integers()),
))
def test_circuit_task_builders_refuse_malformed_arguments(tiny, case):
    from cwlens.circuits import tasks

    task, name, value = case
    known = name in inspect.signature(tasks.TASKS[task]).parameters
    # a known keyword: the builder itself (unchecked); an unknown one: build_task's check
    build = raw(tasks.TASKS[task]) if known else (lambda m, **kw: raw(tasks.build_task)(task, m, **kw))
    refuses(lambda: build(tiny[0], **{name: value}))


# -- the command line -------------------------------------------------------------------
not_positive_text = st.one_of(st.integers(max_value=0).map(str), st.sampled_from(["", "x", "1.5", "nan", "2e"]))
not_fraction_text = st.one_of(st.floats(allow_nan=True).filter(lambda v: not 0 <= v <= 1).map(repr),
                              st.sampled_from(["", "abc", "0,,1", "0.1,0.1", "0", "1", "0,1"]))
OPTIONS = {
    ("circuits", "--k"): not_positive_text,
    ("circuits", "--top"): not_positive_text,
    ("circuits", "--prompts"): not_positive_text,
    ("circuits", "--length"): not_positive_text,
    ("circuits", "--threshold"): st.one_of(st.floats(max_value=-1e-9).map(repr),
                                           st.sampled_from(["nan", "inf", "-inf", "x", ""])),
    ("circuits", "--seed"): st.one_of(st.integers(max_value=-1).map(str), st.sampled_from(["x", "1.5"])),
    ("circuits", "--task"): st.text(min_size=1, max_size=6).filter(
        lambda t: t not in ("ioi", "induction", "capitals") and not t.startswith("-")),
    ("export", "--k"): not_positive_text,
    ("export", "--max-tokens"): not_positive_text,
    ("export", "--metrics"): st.sampled_from(["", "x", "contribution,contribution", "attention,,alti"]),
    ("export", "--token-layers"): st.sampled_from(["-1", "a", "0,0", "1.5", ""]),
    ("replicate", "--rates"): not_fraction_text,
    ("replicate", "--models"): st.sampled_from(["", ",", "a,,b", "a,a"]),
    ("replicate", "--samples"): not_positive_text,
    ("analyze", "--window"): not_positive_text,
    ("analyze", "--max-mb"): st.sampled_from(["0", "-1", "nan", "inf", "x"]),
}
NEEDS = {"export": ["--text", "the cat"], "analyze": ["--text", "the cat"]}


@SETTINGS
@given(data=st.data())
def test_malformed_command_line_options_are_usage_errors(data, capsys):
    command, flag = data.draw(st.sampled_from(sorted(OPTIONS)))
    value = data.draw(OPTIONS[(command, flag)])
    argv = [command, *NEEDS.get(command, []), f"{flag}={value}", "--device", "cpu"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, (argv, err)
    assert "Traceback" not in err
    errors = [x for x in err.splitlines() if "error:" in x]
    assert len(errors) == 1 and flag in errors[0], (argv, err)
