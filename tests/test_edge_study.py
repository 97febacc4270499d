"""The per-edge study: records, resume, the summary's JSON and the CLI."""

import json
import subprocess
import sys

import pytest
import torch

from cwlens.engine.handle import wrap
from cwlens.groundtruth import edge_study
from cwlens.groundtruth.edge_study import EdgeInput, EdgeSettings, edge_kinds, run_edges, summarise
from cwlens.groundtruth.edges import edge_effects
from cwlens.testing import save_tiny, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _items(n: int = 4) -> list[EdgeInput]:
    g = torch.Generator().manual_seed(0)
    return [EdgeInput(f"x{i}", torch.randint(1, 50, (10,), generator=g)) for i in range(n)]


def test_edge_kinds_partition_the_keys():
    for q, n in ((0, 1), (1, 2), (5, 6), (20, 21), (1, 30), (5, 12)):  # n > q + 1: an encoder
        kinds = edge_kinds(q, n)
        total = sum(m.long() for m in kinds.values())
        assert (total == 1).all()
        assert kinds["sink"][0] and (q == 0 or kinds["self"][q])


def test_one_edge_removed_jointly_is_its_single_effect(model):
    item = _items(1)[0]
    record = edge_study.measure_input(wrap(model), item, methods=("attention", "contribution"))
    fx = edge_effects(model, item.tokens)
    for li, layer in enumerate(record["layers"]):
        best = float(fx.effect[li][fx.eligible[li]].max())
        oracle = layer["joint"]["oracle"]["1"]
        assert oracle["drop"] == pytest.approx(best, abs=1e-12)
        assert oracle["additive"] == pytest.approx(best, abs=1e-12)


def test_resume_reuses_stored_inputs_and_recomputes_missing(model, tmp_path, monkeypatch):
    items = _items(4)
    first = run_edges(wrap(model), items, tmp_path, {"v": 1}, progress=False,
                      settings=edge_study.EdgeSettings(methods=("attention", "contribution")))
    files = sorted((tmp_path / "inputs").glob("*.json"))
    assert len(files) == 4
    calls = []
    real = edge_study.measure_input

    def spy(m, item, **kw):
        calls.append(item.id)
        return real(m, item, **kw)

    monkeypatch.setattr(edge_study, "measure_input", spy)
    files[2].unlink()
    again = run_edges(wrap(model), items, tmp_path, {"v": 1}, progress=False,
                      settings=edge_study.EdgeSettings(methods=("attention", "contribution")))
    assert calls == [files[2].name.split("-")[0]]
    assert again == first
    # the first n inputs of a larger run: nothing recomputed
    assert run_edges(wrap(model), items[:2], tmp_path, {"v": 1}, progress=False) == first[:2]
    assert len(calls) == 1
    with pytest.raises(Exception, match="other settings"):
        run_edges(wrap(model), items, tmp_path, {"v": 2}, progress=False)


def test_summary_has_the_documented_fields(model):
    records = run_edges(wrap(model), _items(4), None, {}, progress=False)
    s = summarise(records, {"model": "tiny", "data": "random", "objective": "logprob"})
    assert {"model", "data", "objective", "n_inputs", "n_edges", "methods", "paired",
            "joint_removal", "kinds_truth"} <= set(s)
    assert s["n_inputs"] == 4 and s["n_edges"] == sum(r["n_edges"] for r in records)
    c = s["methods"]["contribution"]
    assert {"spearman_abs", "ci", "spearman_signed", "topk_recall", "captured"} <= set(c)
    assert set(c["topk_recall"]) == set(c["captured"]) == {"1", "5", "10"}
    assert c["ci"][0] <= c["spearman_abs"] <= c["ci"][1]
    assert "contribution - attention: spearman_abs" in s["paired"]
    assert s["methods"]["attention_gradient"]["spearman_abs"] > 0.9  # first order, tiny model
    json.dumps(s)  # JSON-ready


def test_report_tables_are_well_formed_with_fewer_layers_than_thirds(model):
    """Every markdown table's separator has its header's columns (one layer: one third)."""
    from cwlens.groundtruth import edge_report

    settings = EdgeSettings("logprob", [1], torch.float64, ("attention", "contribution"))
    records = run_edges(wrap(model), _items(2), None, {}, progress=False, settings=settings)
    header = {"model": "tiny", "data": "random", "objective": "logprob", "dtype": "float64", "max_tokens": None,
              "query": -1, "command": "test"}
    text = edge_report.markdown(summarise(records, header))
    lines = text.splitlines()
    seps = [i for i, line in enumerate(lines) if line.startswith("|---")]
    assert seps
    for i in seps:
        assert lines[i].count("---") == lines[i - 1].count("|") - 1, (lines[i - 1], lines[i])


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "cwlens", "groundtruth", "--edges", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def test_cli_on_a_local_model(tmp_path):
    path = save_tiny("llama", tmp_path / "model")
    out = tmp_path / "run"
    done = _cli("--model", str(path), "--text", "a b c d e f g", "--text", "h i j k l m n o",
                "--text", "p q r s t u", "--out", str(out), "--json", str(tmp_path / "s.json"),
                "--methods", "attention,contribution,value_weighted", "--no-progress", "--no-png",
                "--summary-md", str(tmp_path / "doc.md"))
    assert done.returncode == 0, done.stderr
    assert [f.name for f in (out / "figures").iterdir()] == [f"edges_captured_{path.name}-text-logprob.html"]
    doc = (tmp_path / "doc.md").read_text()
    assert "<!-- edge-truth:" in doc and "| contribution (inter) |" in doc
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["n_inputs"] == 3 and set(s["methods"]) == {"attention", "contribution", "value_weighted"}
    assert "| contribution (inter) |" in done.stdout and (out / "tables.md").exists()


def test_cli_on_an_encoder_scores_whole_sentences_by_the_embedding(tmp_path):
    path = save_tiny("bert", tmp_path / "model")
    done = _cli("--model", str(path), "--data", "fineweb_edu", "--samples", "2", "--objective",
                "embedding", "--query", "1", "--out", str(tmp_path / "run"), "--json",
                str(tmp_path / "s.json"), "--methods", "attention,contribution", "--no-progress",
                "--figures", "")
    assert done.returncode == 0, done.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["n_inputs"] == 2 and s["objective"] == "embedding"
    stored = sorted(r.name for r in (tmp_path / "run" / "inputs").iterdir())
    assert len(stored) == 2 and all(r.is_file() for r in (tmp_path / "run" / "inputs").iterdir()), stored



def test_cli_notes_a_logit_objective_on_an_encoder(capsys):
    import argparse

    from cwlens.cli.groundtruth_edges import _items
    from cwlens.engine.handle import wrap

    args = argparse.Namespace(max_tokens=64, objective="logprob", model="tiny-bert", text=["a b c d"],
                              data="gsm8k", samples=1, query=-1)
    assert len(_items(args, wrap(tiny_model("bert")))) == 1
    assert "--objective embedding" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (("--data", "gsm8k", "--objective", "logit_diff"), "logit_diff needs two answers"),
    (("--methods", "attention,magic"), "magic"),
    (("--data", "ioi", "--objective", "nll"), "nll reads a text"),
    (("--objective", "embedding"), "is a decoder"),
])
def test_cli_refuses_bad_combinations(tmp_path, args, message):
    path = save_tiny("llama", tmp_path / "model")
    done = _cli("--model", str(path), "--samples", "3", "--out", str(tmp_path / "r"), "--figures", "", *args)
    assert done.returncode != 0
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_torchrun_two_processes_give_the_one_process_summary(tmp_path):
    from tests.test_distributed import env, finish, torchrun

    path = save_tiny("llama", tmp_path / "model")
    texts = [t for i in range(4) for t in ("--text", " ".join("abcdefghij"[i:] + "k"))]
    common = ["groundtruth", "--edges", "--model", str(path), *texts, "--figures", "",
              "--methods", "attention,contribution", "--no-progress"]
    one = subprocess.run([sys.executable, "-m", "cwlens", *common, "--out", str(tmp_path / "one")],
                         env=env(), capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    code, out, err = finish(torchrun(2, "-m", "cwlens", *common, "--out", str(tmp_path / "two")))
    assert code == 0, err[-3000:]
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    a.pop("wall_s_this_run"), b.pop("wall_s_this_run")
    assert a == b
    assert len(list((tmp_path / "two" / "inputs").glob("*.json"))) == 4


def test_cli_scores_a_compiled_program_against_the_graded_truth(tmp_path):
    done = _cli("--data", "tracr", "--program", "reverse", "--samples", "3", "--out",
                str(tmp_path / "run"), "--json", str(tmp_path / "t.json"), "--no-progress")
    assert done.returncode == 0, done.stderr
    s = json.loads((tmp_path / "t.json").read_text())
    reverse = s["programs"]["reverse"]
    assert reverse["n_inputs"] == 3 and reverse["objective"] == "logit"
    assert (tmp_path / "run" / "summary.json").exists()


def test_padding_heads_are_in_no_edge_score():
    from cwlens.groundtruth import encode, load
    from cwlens.groundtruth.edge_programs import program_records
    from cwlens.groundtruth.padding import padding_heads

    program = load("reverse")
    padding = padding_heads(program)
    assert padding.any()
    inp = program.sample_inputs(1, 0)[0]
    fx = edge_effects(program.model, encode(program.model, inp)[0], objective="logit")
    real = int(((fx.alpha > 0) & ~padding[:, :, None]).sum())
    record = program_records(program, 1, methods=("attention",))[0]
    assert record["n_edges"] == real < fx.n_edges


def test_the_captured_curve_of_an_undefined_method_is_nan():
    """A method without weights for the objective (NaN: attention x gradient under kl or
    embedding) has no curve in the figure, as it has no cell in the tables."""
    from cwlens.core.edge_scoring import captured_curve

    effect = torch.tensor([0.5, -0.1, 0.3, 0.0])
    assert captured_curve(torch.full((4,), float("nan")), effect, 3).isnan().all()
    curve = captured_curve(torch.tensor([1.0, 0.0, 2.0, 0.5]), effect, 3)
    torch.testing.assert_close(curve, torch.tensor([0.3 / 0.5, 0.8 / 0.8, 0.8 / 0.9], dtype=torch.float64))


def test_a_float32_run_scores_every_method(model):
    """float32 reads log p by edges.log_prob, which attention x gradient differentiates."""
    settings = EdgeSettings("logprob", None, torch.float32)
    records = run_edges(wrap(model), _items(1), None, {}, progress=False, settings=settings)
    s = summarise(records, {"model": "tiny", "data": "random", "objective": "logprob",
                            "dtype": "float32", "max_tokens": None, "query": -1, "command": "test"})
    assert s["methods"]["attention_gradient"]["spearman_abs"] > 0.9
