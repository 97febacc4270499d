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
    from cwlens.models.loading import load_model
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


def start_script(tmp_path, out, delay):
    """The sweep in a subprocess (so that it can be SIGKILLed)."""
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    args = [sys.executable, str(script), str(tmp_path / "tiny-lm"), str(out), str(delay)]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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
    s = summarize(pd.DataFrame(data))
    cell = s[(s.metric == "contribution") & (s["mode"] == "comprehensiveness")].iloc[0]
    assert cell["n"] == 20 and cell.ci_low < cell["mean"] < cell.ci_high
    assert hierarchy_verdict(s, "toy", "comprehensiveness", 0.3, "delta_ppl").endswith("holds")
    assert hierarchy_verdict(s, "toy", "sufficiency", 0.3, "delta_ppl") == "attn < vw < vwon < contrib: holds"
    md = markdown_tables(s)
    assert "| contrib |" in md and "comp 0.3" in md


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
