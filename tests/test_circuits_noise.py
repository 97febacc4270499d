"""#39.8: `cwlens circuits --prompts 2` printed rankings and Spearman values with no word
about noise. The per-prompt scores average to compare_with_patching's, the resampled
agreement shrinks with the prompts as it should, and below the measured number of
prompts (cwlens.circuits.noise.MIN_PROMPTS, scripts/circuits_noise.py) the printed
comparison says that its figures are within the noise."""

import pytest
import torch
from torch.testing import assert_close

from cwlens import circuits
from cwlens.circuits.noise import (
    MEASURED_SD,
    MIN_PROMPTS,
    NOISE_SD,
    agreement_noise,
    min_prompts,
    noise_note,
    prompt_scores,
)
from cwlens.circuits.results import HeadScores, agreement
from cwlens.testing import tiny_model

TINY_IOI = dict(names=("mary", "john", "cat", "dog"), places=("store", "house"), objects=("drink", "bottle"))


def test_per_prompt_scores_average_to_the_comparison():
    m = tiny_model("llama")
    task = circuits.build_task("induction", m, length=6, n_prompts=5)
    per = prompt_scores(m, task)
    cmp = circuits.compare_with_patching(m, task, k=3)
    assert set(per) == set(cmp.scores)
    for name, s in cmp.scores.items():
        assert per[name].shape == (task.n_prompts, *s.values.shape)
        assert_close(per[name].mean(0), s.values, rtol=1e-5, atol=1e-7, msg=name)
    # a subset of prompts is the same task on those prompts
    sub = task.subset([3, 1])
    assert torch.equal(sub.clean, task.clean[[3, 1]]) and torch.equal(sub.keys, task.keys[[3, 1]])


def _synthetic(n_pool=40, noise=1.0, seed=0):
    """Patching effects and a score that equals them plus independent per-prompt noise."""
    g = torch.Generator().manual_seed(seed)
    truth = torch.randn(6, 9, generator=g, dtype=torch.float64)
    patching = truth + noise * torch.randn(n_pool, 6, 9, generator=g, dtype=torch.float64)
    score = truth + noise * torch.randn(n_pool, 6, 9, generator=g, dtype=torch.float64)
    return {"score": score, "patching": patching}


def test_resampled_agreement_narrows_with_more_prompts_and_centres_on_the_pool():
    per = _synthetic()
    noise = agreement_noise(per, [2, 4, 8], draws=100, k=5)
    sp = noise[noise.statistic == "spearman"].set_index("n")
    assert sp.loc[2, "sd"] > sp.loc[4, "sd"] > sp.loc[8, "sd"]  # ~ 1/sqrt(n)
    assert sp.loc[2, "mean"] < sp.loc[8, "mean"] < sp["pool"].iloc[0]  # noise pulls it to 0
    pool = agreement(HeadScores("score", per["score"].mean(0)), HeadScores("p", per["patching"].mean(0)), 5)
    assert sp["pool"].iloc[0] == pytest.approx(pool.spearman)
    assert (sp["low"] <= sp["mean"]).all() and (sp["mean"] <= sp["high"]).all()
    # the threshold: the first n whose worst SD is at most the bound
    assert min_prompts(noise, sd=float(sp.loc[4, "sd"]) + 1e-12) == 4
    assert min_prompts(noise, sd=0.0) is None


def test_a_comparison_below_the_measured_prompts_says_so():
    need = MIN_PROMPTS["ioi"]
    at = noise_note("ioi", need)
    assert at.startswith(f"noise: with {need} prompts") and "warning" not in at
    assert f"±{MEASURED_SD['ioi'][need]:.2f} (1 SD)" in at
    below = noise_note("ioi", 2)
    assert below.startswith("warning: 2 prompts are too few") and f"--prompts {need}" in below
    assert "at least ±" in noise_note("induction", 1)  # below every measured n: a lower bound
    assert noise_note("capitals", 3) == ""  # its fixed list: not measured
    m = tiny_model("llama")
    task = circuits.build_task("ioi", m, **TINY_IOI, n_prompts=2)
    text = circuits.compare_with_patching(m, task, k=3).format(top=3)
    assert text.rstrip().endswith(noise_note("ioi", task.n_prompts))


def test_the_measured_spread_is_the_one_in_the_docs():
    """MEASURED_SD is what scripts/circuits_noise.py printed on SmolLM2 (the worst score's
    SD per n); docs/circuits.md shows the same numbers and thresholds."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "circuits.md").read_text(encoding="utf-8")
    section = text.split("## How many prompts", 1)[1].split("\n## ", 1)[0]
    for task, table in MEASURED_SD.items():
        row = next(line for line in section.splitlines() if line.startswith(f"| {task} |"))
        for n, sd in table.items():
            assert f"{sd:.3f}" in row, (task, n)
        assert f"{task}: {MIN_PROMPTS[task]} prompts" in section
        # and what the script wrote (results/circuits_noise/<task>.csv): the worst score's SD
        import pandas as pd

        csv = pd.read_csv(Path(__file__).resolve().parents[1] / "results" / "circuits_noise" / f"{task}.csv")
        worst = csv[csv.statistic == "spearman"].groupby("n")["sd"].max()
        assert {int(n): round(float(v), 3) for n, v in worst.items()} == table
    assert min_prompts_rule_holds()
    assert noise_note("ioi", 2) in section  # the printed example


def min_prompts_rule_holds() -> bool:
    return all(MEASURED_SD[t][MIN_PROMPTS[t]] <= NOISE_SD
               and all(sd > NOISE_SD for n, sd in MEASURED_SD[t].items() if n < MIN_PROMPTS[t])
               for t in MIN_PROMPTS)


def test_cli_prints_the_note_below_the_agreement_table(tmp_path, capsys):
    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)
    assert main(["circuits", "--model", str(model_dir), "--device", "cpu", "--task", "induction",
                 "--length", "3", "--prompts", "1", "--k", "3", "--out", str(tmp_path / "runs"),
                 "--figures", "", "--top", "3"]) == 0
    text = capsys.readouterr().out
    table = text.index("agreement with patching over 8 heads")
    assert text.index("warning: 1 prompt is too few") > table
