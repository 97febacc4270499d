"""Results on disk: a run killed with SIGKILL resumes to the same table as an uninterrupted
run; torn lines and config changes are handled; summary, report and CLI."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

from cwlens.faithfulness import read_results, summarize
from cwlens.faithfulness.results import ConfigMismatchError, ResultsWriter
from cwlens.testing import save_tiny

SCRIPT = textwrap.dedent("""
    import sys, time
    from cwlens.engine.models.loading import load_model
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
    CONFIG = FaithfulnessConfig(metrics=("attention", "contribution", "random"), rates=(0.3,),
                                max_tokens=16, batch_tokens=32)

    def sweep(model_dir, out, delay=0.0):
        model = load_model(model_dir, device="cpu")
        run_faithfulness(model, "gsm8k", CONFIG, n=8, out=out, progress=False,
                         model_name="tiny", on_sample=lambda s: time.sleep(delay))

    if __name__ == "__main__":
        sweep(sys.argv[1], sys.argv[2], float(sys.argv[3]))
""")


def start_script(tmp_path, out, delay, stderr=subprocess.DEVNULL, env=None):
    """The sweep in a subprocess (so that it can be SIGKILLed)."""
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
           **(env or {})}
    args = [sys.executable, str(script), str(tmp_path / "tiny-lm"), str(out), str(delay)]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True)


def done_samples(path) -> int:
    if not path.exists():
        return 0
    return len({json.loads(x)["sample_id"] for x in path.read_text().splitlines() if x.endswith("}")})


def run_here(tmp_path, out):
    """The same sweep in this process."""
    namespace = {"__name__": "sweep"}
    exec(SCRIPT, namespace)
    namespace["sweep"](str(tmp_path / "tiny-lm"), str(out))


def table(path):
    return read_results(path).sort_values(list(read_results(path).columns[:-1])).reset_index(drop=True)


def test_resume_after_sigkill_gives_the_uninterrupted_table(tmp_path):
    save_tiny("llama", tmp_path)
    killed = tmp_path / "killed.jsonl"
    proc = start_script(tmp_path, killed, delay=0.3)
    deadline = time.time() + 120
    while time.time() < deadline:  # kill once some, not all, samples are on disk
        if killed.exists() and len({json.loads(x)["sample_id"] for x in killed.read_text().splitlines() if x.endswith("}")}) >= 2:
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = read_results(killed)
    assert 2 <= partial.sample_id.nunique() < 8
    run_here(tmp_path, killed)  # resume
    full = tmp_path / "full.jsonl"
    run_here(tmp_path, full)  # uninterrupted
    a, b = table(killed), table(full)
    assert a.sample_id.nunique() == 8 and len(a) == len(b)
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_kill_at_random_points_then_rerun_gives_the_uninterrupted_table(tmp_path):
    """kill -9 three times at random moments (the first inside the config save, via the
    write-delay hook), each run resuming the last; the final table equals one run's."""
    import random

    save_tiny("llama", tmp_path)
    killed = tmp_path / "runs" / "gsm8k.jsonl"
    rng = random.Random(0)
    proc = start_script(tmp_path, killed, 0.2, env={"CWLENS_TEST_WRITE_DELAY": "30"})
    deadline = time.time() + 120
    while not list(killed.parent.glob(".cwlens-tmp-*")) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # during the atomic save of the config
    proc.wait()
    assert list(killed.parent.glob(".cwlens-tmp-*")) and done_samples(killed) == 0
    for _ in range(2):
        before = done_samples(killed)
        proc = start_script(tmp_path, killed, 0.2)
        deadline = time.time() + 120
        while done_samples(killed) <= before and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))  # somewhere inside the next batch or sample
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert 1 <= done_samples(killed) < 8
    run_here(tmp_path, killed)
    assert not list(killed.parent.glob(".cwlens-tmp-*"))  # the stale temp file was cleaned
    full = tmp_path / "full" / "gsm8k.jsonl"
    run_here(tmp_path, full)
    a, b = table(killed), table(full)
    assert a.sample_id.nunique() == 8 and len(a) == len(b) == len(killed.read_text().splitlines())
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_a_second_run_on_the_same_folder_fails_fast_and_the_table_is_one_runs(tmp_path):
    save_tiny("llama", tmp_path)
    shared = tmp_path / "runs" / "gsm8k.jsonl"
    # 30 s per sample: the first outlives the second's start even on a loaded machine
    first = start_script(tmp_path, shared, 30.0)
    deadline = time.time() + 120
    while done_samples(shared) < 1 and time.time() < deadline:
        time.sleep(0.05)
    second = start_script(tmp_path, shared, 0.0, stderr=subprocess.PIPE)
    _, err = second.communicate(timeout=180)
    assert second.returncode != 0 and first.poll() is None  # refused while the first still runs
    assert "ResultsLockedError" in err and f"in use by pid {first.pid}" in err
    os.kill(first.pid, signal.SIGKILL)  # then the first is stopped and resumed here: the
    first.wait()  # table holds no row of the refused run
    run_here(tmp_path, shared)
    full = tmp_path / "full" / "gsm8k.jsonl"
    run_here(tmp_path, full)
    pd.testing.assert_frame_equal(table(shared), table(full), check_exact=True)
    assert len(shared.read_text().splitlines()) == len(full.read_text().splitlines())


def rows(sid, n=3):
    return [{"model": "m", "dataset": "d", "metric": "attention", "mode": "comprehensiveness",
             "rate": 0.1, "scope": "row", "layers": "all", "sample_id": sid,
             "measure": f"x{i}", "value": float(i)} for i in range(n)]


def test_torn_lines_and_partial_samples_are_dropped_on_resume(tmp_path):
    path = tmp_path / "r.jsonl"
    w = ResultsWriter(path, {"a": 1}, rows_per_sample=3)
    w.write_sample(rows("s0"))
    with open(path, "a") as f:  # a kill mid-write: one complete row of s1, then a torn one
        f.write(json.dumps(rows("s1")[0]) + "\n" + '{"model": "m", "data')
    assert len(read_results(path)) == 4  # the torn line is ignored when reading
    w = ResultsWriter(path, {"a": 1}, rows_per_sample=3)
    assert w.done == {"s0"}
    assert len(read_results(path)) == 3
    with pytest.raises(ConfigMismatchError, match="differs in a"):
        ResultsWriter(path, {"a": 2}, rows_per_sample=3)
    assert ResultsWriter(path, {"a": 2}, rows_per_sample=3, resume=False).done == set()


def test_summary_bootstrap_and_markdown():
    from cwlens.faithfulness.report import hierarchy_verdict, markdown_tables

    data = []
    for metric, shift in (("attention", 1.0), ("value_weighted", 2.0),
                          ("value_weighted_output_normalized", 3.0), ("contribution", 4.0)):
        for i in range(20):
            for mode, sign in (("comprehensiveness", 1), ("sufficiency", -1)):
                data.append({"model": "m", "dataset": "toy", "metric": metric, "mode": mode,
                             "rate": 0.3, "scope": "row", "layers": "all", "sample_id": f"s{i}",
                             "measure": "delta_ppl", "value": 10 + sign * shift + 0.1 * i})
    df = pd.DataFrame(data)
    s = summarize(df)
    cell = s[(s.metric == "contribution") & (s["mode"] == "comprehensiveness")].iloc[0]
    assert cell["n"] == 20 and cell.ci_low < cell["mean"] < cell.ci_high
    assert hierarchy_verdict(df, "toy", "comprehensiveness", 0.3, "delta_ppl").endswith("holds")
    assert hierarchy_verdict(df, "toy", "sufficiency", 0.3, "delta_ppl") == "attn < vw < vwon < contrib: holds"
    md = markdown_tables(s, df)
    assert "| contrib |" in md and "comp 0.3" in md and "paired bootstrap" in md
    with pytest.raises(TypeError, match="per-sample"):
        hierarchy_verdict(s, "toy", "sufficiency", 0.3, "delta_ppl")


def test_one_sample_prints_means_without_nan_intervals():
    """One long document (cwlens faithfulness --file): no "[nan, nan]", no hierarchy."""
    from cwlens.faithfulness.report import markdown_tables

    rows = [{"model": "m", "dataset": "doc", "metric": "none", "mode": "clean", "rate": 0.0,
             "scope": "row", "layers": "none", "sample_id": "d0", "measure": "ppl", "value": 58.85}]
    rows += [{"model": "m", "dataset": "doc", "metric": m, "mode": "comprehensiveness", "rate": 0.1,
              "scope": "row", "layers": "15", "sample_id": "d0", "measure": "delta_ppl", "value": v}
             for m, v in (("contribution", 8.58), ("random", 0.37))]
    df = pd.DataFrame(rows)
    md = markdown_tables(summarize(df), df)
    assert "nan" not in md
    assert "mean (1 sample: no interval, the bootstrap needs 3), n = 1" in md and "(clean ppl: 58.85)" in md
    assert "| contrib | 8.58 |" in md and "No hierarchy: its paired test needs at least 3" in md


def test_verdict_is_unresolved_where_the_paired_interval_contains_zero():
    """Point means in the paper's order, but per-sample differences that are noise: the
    old verdict said "holds"; the paired bootstrap says "unresolved"."""
    import numpy as np

    from cwlens.faithfulness.report import hierarchy_verdict

    rng = np.random.default_rng(0)
    base = rng.normal(100, 30, 30)
    data = []
    for metric in ("attention", "value_weighted", "value_weighted_output_normalized", "contribution"):
        # vw and vwon identical (as at row scope); contrib far above; attn vs vw: noise
        noise = rng.normal(0, 20, 30) if metric == "attention" else np.zeros(30)
        noise -= noise.mean()
        shift = {"attention": -2.0, "value_weighted": 0.0, "value_weighted_output_normalized": 0.0,
                 "contribution": 50.0}[metric]
        values = base + shift + noise
        data += [{"dataset": "toy", "metric": metric, "mode": "comprehensiveness", "rate": 0.3,
                  "scope": "row", "layers": "all", "sample_id": f"s{i}", "measure": "delta_ppl",
                  "value": float(v)} for i, v in enumerate(values)]
    df = pd.DataFrame(data)
    means = df.groupby("metric")["value"].mean()
    assert means["attention"] < means["value_weighted"] < means["contribution"]  # old: "holds"
    verdict = hierarchy_verdict(df, "toy", "comprehensiveness", 0.3, "delta_ppl")
    assert verdict == "attn ≈ vw = vwon < contrib: unresolved (attn vs vw); contribution best"
    # a resolved reversal is named
    df.loc[df.metric == "contribution", "value"] -= 200.0
    assert hierarchy_verdict(df, "toy", "comprehensiveness", 0.3, "delta_ppl").endswith(
        "does not hold (vwon > contrib)")


def test_rows_are_deduplicated_and_settings_are_not_pooled(tmp_path):
    from cwlens.cli.main import main
    from cwlens.faithfulness import FaithfulnessConfig

    path = tmp_path / "gsm8k.jsonl"
    w = ResultsWriter(path, {}, rows_per_sample=1)
    for sid, v in (("a", 1.0), ("b", 3.0)):
        w.write_sample([{**rows(sid, 1)[0], "dataset": "gsm8k", "measure": "delta_ppl", "value": v}])
    copy = tmp_path / "copy" / "gsm8k.jsonl"  # a second run's file with the same rows
    copy.parent.mkdir()
    copy.write_text(path.read_text())
    assert len(read_results([path, path])) == 2 and len(read_results([path, copy])) == 2
    assert summarize(pd.concat([read_results(path)] * 2))["n"].tolist() == [2]
    # another model's file is read beside it, not pooled with it
    other = tmp_path / "other" / "gsm8k.jsonl"
    other.parent.mkdir()
    other.write_text(path.read_text().replace('"model": "m"', '"model": "m2"'))
    s = summarize(read_results([path, other]))
    assert sorted(s.model) == ["m", "m2"] and s["n"].tolist() == [2, 2]
    # repeated list entries do not repeat conditions
    cfg = FaithfulnessConfig(rates=(0.3, 0.3), metrics=("attention", "attention"), modes=("sufficiency",) * 2)
    assert cfg.rates == (0.3,) and cfg.metrics == ("attention",) and len(cfg.conditions(2)) == 1
    capsys_out = tmp_path / "doc.md"
    # a dataset listed twice is refused before anything runs (it would count every sample twice)
    with pytest.raises(SystemExit) as exit_info:
        main(["faithfulness", "--dataset", "gsm8k,gsm8k", "--out", str(tmp_path), "--report-only"])
    assert exit_info.value.code == 2
    assert main(["faithfulness", "--dataset", "gsm8k", "--out", str(tmp_path), "--report-only",
                 "--figures", "", "--summary-md", str(capsys_out)]) == 0
    assert "n = 2," in capsys_out.read_text()


def test_summary_block_ends_at_the_first_end_marker_after_the_start(tmp_path):
    from cwlens.faithfulness.report import END, START, write_block

    md = tmp_path / "doc.md"
    head = f"# Doc\n\nThe tables sit between\n{END}\nand its start marker (quoted here).\n\n"
    tail = "\n## After\n\nkept\n"
    md.write_text(head + f"{START}\nold\n{END}\n" + tail)
    write_block(md, "new table")
    assert md.read_text() == head + f"{START}\nnew table\n{END}\n" + tail
    write_block(md, "newer")
    assert md.read_text() == head + f"{START}\nnewer\n{END}\n" + tail
    inline = tmp_path / "inline.md"  # markers quoted inside a line are not markers
    inline.write_text(f"use `{START}` and `{END}`\n")
    write_block(inline, "t")
    assert inline.read_text() == f"use `{START}` and `{END}`\n{START}\nt\n{END}\n"


def test_write_block_refuses_an_unclosed_or_repeated_block_and_non_utf8(tmp_path):
    from cwlens.errors import InvalidArgumentError
    from cwlens.faithfulness.report import END, START, write_block

    md = tmp_path / "doc.md"
    for text, why in ((f"# Doc\n\n{START}\nold tables\n", r"line 3 opens .* no .* closes"),
                      (f"{START}\na\n{END}\n{START}\nb\n{END}\n", r"two .* lines \(lines 1 and 4\)")):
        md.write_text(text)
        with pytest.raises(InvalidArgumentError, match=why):
            write_block(md, "new")
        assert md.read_text() == text  # nothing written
    md.write_bytes(b"caf\xe9\n")  # Latin-1
    with pytest.raises(InvalidArgumentError, match="not UTF-8 text"):
        write_block(md, "new")


def test_cli_checks_the_summary_page_before_running(tmp_path, capsys):
    """A data file as --summary-md, or a page whose block cannot be replaced, fails
    before any model is loaded; a folder without complete rows writes no empty page."""
    from cwlens.cli.main import main
    from cwlens.faithfulness.report import START

    base = ["faithfulness", "--dataset", "gsm8k", "--out", str(tmp_path / "r"), "--report-only",
            "--figures", ""]
    ResultsWriter(tmp_path / "r" / "gsm8k.jsonl", {}, rows_per_sample=1)
    (tmp_path / "r" / "gsm8k.jsonl").write_text("")  # a run stopped before its first sample
    gz = tmp_path / "r" / "x.jsonl.gz"
    assert main([*base, "--summary-md", str(gz)]) == 1
    assert "is not a Markdown page" in capsys.readouterr().err
    assert not gz.exists()
    broken = tmp_path / "broken.md"
    broken.write_text(f"{START}\n")
    assert main([*base, "--summary-md", str(broken)]) == 1
    assert "no <!-- faithfulness-results:end --> line closes" in capsys.readouterr().err
    md = tmp_path / "new.md"
    assert main([*base, "--summary-md", str(md)]) == 1
    assert "no complete result rows" in capsys.readouterr().err
    assert not md.exists()


def test_corrupt_config_names_the_file_and_the_fix(tmp_path):
    from cwlens.faithfulness.results import ConfigMismatchError

    path = tmp_path / "d.jsonl"
    w = ResultsWriter(path, {"a": 1}, rows_per_sample=3)
    w.write_sample(rows("s0"))
    (tmp_path / "d.config.json").write_text('{"a": 1')  # cut by an editor
    with pytest.raises(ConfigMismatchError, match=r"d\.config\.json is not readable JSON.*--no-resume"):
        ResultsWriter(path, {"a": 1}, rows_per_sample=3)


def test_cli_help_and_report_only(tmp_path):
    from cwlens.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["faithfulness", "--help"])
    assert exc.value.code == 0
    w = ResultsWriter(tmp_path / "gsm8k.jsonl", {}, rows_per_sample=1)
    for sid, v in (("a", 1.0), ("b", 3.0)):
        w.write_sample([{**rows(sid, 1)[0], "dataset": "gsm8k", "measure": "delta_ppl", "value": v}])
    md = tmp_path / "doc.md"
    md.write_text("# Title\n\ntext\n")
    assert main(["faithfulness", "--dataset", "gsm8k", "--out", str(tmp_path), "--report-only",
                 "--figures", "", "--summary-md", str(md)]) == 0
    text = md.read_text()
    assert text.startswith("# Title") and "faithfulness-results:start" in text and "2.00" in text
    main(["faithfulness", "--dataset", "gsm8k", "--out", str(tmp_path), "--report-only",
          "--figures", "", "--summary-md", str(md)])
    assert md.read_text() == text  # the block is replaced, not appended


def test_shards_read_as_one_table_and_resume_across_them(tmp_path):
    """Processes of a split run write their own shard files; readers and every writer's
    resume see the file and its shards as one table (the layout issue 10 builds on)."""
    path = tmp_path / "gsm8k.jsonl"
    a = ResultsWriter(path, {"c": 1}, rows_per_sample=3, shard="0")
    b = ResultsWriter(path, {"c": 1}, rows_per_sample=3, shard="1")
    a.write_sample(rows("s0"))
    b.write_sample(rows("s1"))
    b.write_sample(rows("s0"))  # a sample computed twice (e.g. after a crash) counts once
    assert not path.exists() and sorted(p.name for p in tmp_path.glob("*.jsonl")) == [
        "gsm8k.shard-0.jsonl", "gsm8k.shard-1.jsonl"]
    assert len(read_results(path)) == 6
    assert ResultsWriter(path, {"c": 1}, rows_per_sample=3).done == {"s0", "s1"}
    with open(tmp_path / "gsm8k.shard-1.jsonl", "a") as f:  # another shard's torn line
        f.write('{"model": "m"')
    assert ResultsWriter(path, {"c": 1}, rows_per_sample=3, shard="0").done == {"s0", "s1"}
    assert ResultsWriter(path, {"c": 1}, rows_per_sample=3, resume=False).done == set()
    assert not list(tmp_path.glob("gsm8k*.jsonl"))


def test_a_partly_done_batch_is_recomputed_whole_and_only_its_missing_samples_written(tmp_path):
    save_tiny("llama", tmp_path)
    full = tmp_path / "full" / "gsm8k.jsonl"
    run_here(tmp_path, full)
    lines = full.read_text().splitlines()
    ids = list(dict.fromkeys(json.loads(x)["sample_id"] for x in lines))
    cut = tmp_path / "cut" / "gsm8k.jsonl"  # every sample but one: its batch mates are done
    cut.parent.mkdir()
    cut.write_text("".join(x + "\n" for x in lines if json.loads(x)["sample_id"] != ids[3]))
    (cut.parent / "gsm8k.config.json").write_text((full.parent / "gsm8k.config.json").read_text())
    run_here(tmp_path, cut)
    assert len(cut.read_text().splitlines()) == len(lines)
    pd.testing.assert_frame_equal(table(cut), table(full), check_exact=True)


def test_every_metric_identical_is_not_tested_not_holds():
    """A rate that masks nothing (round(0.01 n) = 0 in short rows) gives every metric the
    clean scores: the chain is "=" all along, which shows nothing (it read "holds, with
    ties")."""
    from cwlens.faithfulness.report import hierarchy_verdict

    data = [{"dataset": "toy", "metric": metric, "mode": "comprehensiveness", "rate": 0.01,
             "scope": "row", "layers": "all", "sample_id": f"s{i}", "measure": "accuracy",
             "value": float(i % 2)}
            for metric in ("attention", "value_weighted", "value_weighted_output_normalized",
                           "contribution") for i in range(20)]
    verdict = hierarchy_verdict(pd.DataFrame(data), "toy", "comprehensiveness", 0.01, "accuracy")
    assert verdict == "attn = vw = vwon = contrib: not separated (every metric scored the same on every sample)"


def test_another_text_under_the_same_file_name_is_refused(tmp_path, capsys):
    """--file results are keyed by the text's hash: an edited file (or another file of the
    same name) does not resume from the old text's rows."""
    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    model = save_tiny("llama", tmp_path)
    text = tmp_path / "a.txt"
    text.write_text("the cat sat on the mat and the dog sat on the log")
    argv = ["faithfulness", "--model", str(model), "--device", "cpu", "--file", str(text),
            "--max-tokens", "16", "--rates", "0.3", "--metrics", "attention,random",
            "--out", str(tmp_path / "r"), "--figures", "", "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    text.write_text("a different text entirely, of about the same length as before")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "another configuration (differs in samples)" in err
    assert "--no-resume" in err
    assert main([*argv, "--no-resume"]) == 0


def test_report_only_names_an_unfinished_run(tmp_path, capsys):
    from cwlens.cli.main import main

    out = tmp_path / "r"
    w = ResultsWriter(out / "gsm8k.jsonl", {"samples": ["a", "b", "c"], "metrics": ["attention"]},
                      rows_per_sample=1)
    for sid, v in (("a", 1.0), ("b", 3.0)):
        w.write_sample([{**rows(sid, 1)[0], "dataset": "gsm8k", "measure": "delta_ppl", "value": v}])
    md = tmp_path / "doc.md"
    assert main(["faithfulness", "--dataset", "gsm8k", "--out", str(out), "--report-only",
                 "--figures", "", "--summary-md", str(md)]) == 0
    note = "holds 2 of the 3 samples of its configuration; rerun the same command without --report-only"
    assert note in capsys.readouterr().out and note in md.read_text()


def test_report_only_with_metrics_shows_those_metrics_only(tmp_path, capsys):
    """--report-only --metrics limits the tables (it was ignored): e.g. leave out a metric
    whose rows are still being added."""
    from cwlens.cli.main import main

    out = tmp_path / "r"
    w = ResultsWriter(out / "gsm8k.jsonl", {"samples": ["a", "b", "c"],
                                            "metrics": ["attention", "random"]}, rows_per_sample=2)
    for sid, v in (("a", 1.0), ("b", 3.0), ("c", 2.0)):
        w.write_sample([{**rows(sid, 1)[0], "dataset": "gsm8k", "measure": "delta_ppl", "value": v},
                        {**rows(sid, 1)[0], "dataset": "gsm8k", "measure": "delta_ppl",
                         "metric": "random", "value": v / 2}])
    base = ["faithfulness", "--dataset", "gsm8k", "--out", str(out), "--report-only", "--figures", ""]
    assert main(base) == 0
    both = capsys.readouterr().out
    assert "| attn |" in both and "| random |" in both
    assert main([*base, "--metrics", "attention"]) == 0
    one = capsys.readouterr().out
    assert "| attn |" in one and "| random |" not in one and "Unfinished" not in one
    # a metric the file does not hold: refused (it printed an empty table and exited 0)
    assert main([*base, "--metrics", "contribution"]) == 1
    err = capsys.readouterr().err
    assert "no rows of contribution" in err and "it holds attention, random" in err


def test_the_same_metrics_in_another_order_resume(tmp_path):
    """--metrics random,attention after attention,random is the same run (it was refused
    as another configuration)."""
    from cwlens.faithfulness.results import ConfigMismatchError, same_config

    path = tmp_path / "d.jsonl"
    w = ResultsWriter(path, {"metrics": ["attention", "random"], "seed": 0}, rows_per_sample=3)
    w.write_sample(rows("s0"))
    again = ResultsWriter(path, {"metrics": ["random", "attention"], "seed": 0}, rows_per_sample=3)
    assert again.done == {"s0"}
    assert not same_config({"metrics": ["attention"], "seed": 0}, {"metrics": ["attention"], "seed": 1})
    with pytest.raises(ConfigMismatchError, match="differs in metrics"):
        ResultsWriter(path, {"metrics": ["random"], "seed": 0}, rows_per_sample=3)
    with pytest.raises(ConfigMismatchError, match="--batch-tokens fixes the batches"):
        ResultsWriter(path, {"metrics": ["attention", "random"], "seed": 0, "batch_tokens": 9},
                      rows_per_sample=3)



def test_report_only_leaves_out_a_partly_written_sample_and_says_so(tmp_path, capsys):
    """A sample cut mid-write (a kill, a full disk) was counted in the header's n while its
    cells used fewer samples, with no "Unfinished" line."""
    from cwlens.cli.main import main
    from cwlens.faithfulness.results import partial_samples

    out = tmp_path / "r"
    path = out / "gsm8k.jsonl"
    w = ResultsWriter(path, {"samples": ["a", "b", "c"], "metrics": ["attention"]}, rows_per_sample=2)
    for sid, v in (("a", 1.0), ("b", 3.0), ("c", 5.0)):
        w.write_sample([{**r, "dataset": "gsm8k", "measure": m, "value": v}
                        for r, m in zip(rows(sid, 2), ("delta_ppl", "delta_nll"), strict=True)])
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")  # c keeps one of its two rows
    assert partial_samples(read_results(path)) == ["c"]
    assert main(["faithfulness", "--dataset", "gsm8k", "--out", str(out), "--report-only",
                 "--figures", ""]) == 0
    text = capsys.readouterr().out
    assert "1 sample(s) only partly written (c) are left out" in text
    assert "holds 2 of the 3 samples" in text and "n = 2" in text and "n = 3" not in text


def test_report_only_names_the_flags_it_does_not_follow(tmp_path, capsys):
    """--report-only summarises the stored rows: --rates, --scope, --model, --samples ...
    that differ from the stored run were ignored without a word."""
    from cwlens.cli.main import main

    out = tmp_path / "r"
    w = ResultsWriter(out / "gsm8k.jsonl", {"samples": ["a", "b", "c"], "metrics": ["attention"],
                                            "model": "tiny", "rates": [0.5], "scope": "row",
                                            "causal_only": True}, rows_per_sample=1)
    for sid in "abc":
        w.write_sample([{**rows(sid, 1)[0], "dataset": "gsm8k", "measure": "delta_ppl", "value": 1.0}])
    base = ["faithfulness", "--dataset", "gsm8k", "--out", str(out), "--report-only", "--figures", ""]
    assert main([*base, "--model", "tiny", "--rates", "0.5", "--samples", "3"]) == 0
    assert "note" not in capsys.readouterr().err  # what the run used: nothing to say
    assert main([*base, "--model", "other", "--rates", "0.3", "--scope", "layer", "--samples", "2",
                 "--non-causal", "--no-resume"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    for part in ("--model tiny (asked: other)", "--rates 0.5 (asked: 0.3)",
                 "--scope row (asked: layer)", "no --non-causal (asked)", "--samples 3 (asked: 2)",
                 "--no-resume has no effect with --report-only"):
        assert part in err, part


def test_results_without_their_config_file_name_the_missing_file(tmp_path):
    """A deleted <dataset>.config.json was reported as "another configuration (differs in
    batch_tokens, causal_only, ... every field)" with batch-tokens advice."""
    path = tmp_path / "gsm8k.jsonl"
    ResultsWriter(path, {"a": 1, "batch_tokens": 64}, rows_per_sample=3).write_sample(rows("s0"))
    (tmp_path / "gsm8k.config.json").unlink()
    with pytest.raises(ConfigMismatchError, match="gsm8k.config.json, the record of their "
                       "configuration, is missing") as err:
        ResultsWriter(path, {"a": 1, "batch_tokens": 64}, rows_per_sample=3)
    assert "differs in" not in str(err.value) and "--batch-tokens" not in str(err.value)
    assert ResultsWriter(path, {"a": 1}, rows_per_sample=3, resume=False).done == set()


def test_tables_name_the_masked_layers_of_a_subset_run():
    """A --layers 1 run printed "scope = row" only, so it read as an all-layer result."""
    from cwlens.faithfulness.report import markdown_tables

    def table(layers):
        out = []
        for sid, v in (("a", 1.0), ("b", 2.0), ("c", 4.0)):
            out.append({**rows(sid, 1)[0], "layers": layers, "measure": "delta_ppl", "value": v})
        return pd.DataFrame(out)

    subset, whole = table("1"), table("all")
    assert "masked layers = 1" in markdown_tables(summarize(subset), subset)
    assert "masked layers" not in markdown_tables(summarize(whole), whole)


@pytest.mark.parametrize("line", ['{"x": 1}', "[1, 2]", '"text"'])
def test_a_json_line_that_is_not_a_row_names_the_line(tmp_path, capsys, line):
    """Valid JSON without the row fields raised a TypeError in --report-only and a
    KeyError on resume (a non-JSON line got the one-line error)."""
    from cwlens.cli.main import main

    out = tmp_path / "r"
    path = out / "gsm8k.jsonl"
    w = ResultsWriter(path, {"samples": ["a"], "metrics": ["attention"]}, rows_per_sample=1)
    w.write_sample([{**rows("a", 1)[0], "dataset": "gsm8k", "measure": "delta_ppl", "value": 1.0}])
    with open(path, "a") as f:
        f.write(line + "\n")
    assert main(["faithfulness", "--dataset", "gsm8k", "--out", str(out), "--report-only",
                 "--figures", ""]) == 1
    err = capsys.readouterr().err
    assert "gsm8k.jsonl, line 2: a JSON" in err and "delete that line" in err
    with pytest.raises(ValueError, match="line 2: a JSON"):
        ResultsWriter(path, {"samples": ["a"], "metrics": ["attention"]}, rows_per_sample=1)
