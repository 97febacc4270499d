"""Runs leave the repository as they found it (#41.1): every ``cwlens`` command, run with
its default outputs from the root of a git checkout, writes into its own git-ignored
folder under ``runs/``, never into the tracked ``figures/``, ``docs/`` or ``results/``;
only ``cwlens figures`` (and a flag that names them) rewrites those. Each figure's title
says what it was made from (model, data, n).

The checkout is a small git repository made here with the project's ``.gitignore`` and a
tracked file in each of ``figures/``, ``docs/`` and ``results/``; tiny seeded models and
tiny settings keep every run to seconds.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from cwlens.cli.main import SUBCOMMANDS, main
from cwlens.testing import save_tiny

ROOT = Path(__file__).resolve().parents[1]
TRACKED = ("figures/faithfulness_gsm8k.png", "figures/circuits_induction_agreement.png",
           "docs/replication.md", "results/README.md")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    return str(save_tiny("llama", base)), str(save_tiny("bert", base))


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A git repository with the project's .gitignore and tracked figures, docs and
    results, as the working directory."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    for rel in TRACKED:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(f"tracked {rel}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    monkeypatch.chdir(repo)
    return repo


def _commands(lm: str, enc: str) -> dict[str, list[str]]:
    """Each command with tiny settings and NO output flag: the defaults are under test."""
    cpu = ["--model", lm, "--device", "cpu"]
    return {
        "demo": ["demo", *cpu, "--max-tokens", "12", "--heads", "2", "--no-png"],
        "analyze": ["analyze", *cpu, "--text", "the cat sat on the mat and the dog sat too"],
        "sinks": ["sinks", *cpu, "--samples", "2", "--max-tokens", "12", "--batch-size", "2",
                  "--scales", "0,1", "--no-png", "--no-progress"],
        "faithfulness": ["faithfulness", *cpu, "--samples", "2", "--max-tokens", "12",
                         "--rates", "0.5", "--metrics", "attention,contribution", "--no-png",
                         "--no-progress"],
        "accuracy": ["accuracy", *cpu, "--dataset", "ioi", "--samples", "4"],
        "circuits": ["circuits", *cpu, "--task", "induction", "--prompts", "2", "--length", "3",
                     "--k", "3", "--no-png"],
        "export": ["export", *cpu, "--text", "the cat sat on the mat", "--max-tokens", "12"],
        "graph": ["graph", *cpu, "--text", "the cat sat on the mat", "--no-progress"],
        "groundtruth": ["groundtruth", "--program", "frac_prevs", "--inputs", "3",
                        "--bootstrap", "20", "--no-png", "--no-progress"],
        "replicate": ["replicate", "--models", f"{lm},{enc}", "--device", "cpu",
                      "--per-layer-model", lm, "--samples", "2", "--sentences", "4",
                      "--sink-samples", "2", "--per-layer-samples", "2", "--max-tokens", "16",
                      "--rates", "0.1,0.5,0.9", "--no-png", "--no-progress"],
    }


# where each command's default outputs land (a file or folder that must exist after it)
WRITES = {
    "demo": "runs/demo/demo_attention_vs_contribution.html",
    "analyze": "runs/report.html",
    "sinks": "runs/sinks/figures/sinks_rate_vs_contribution.html",
    "faithfulness": "runs/faithfulness/figures/faithfulness_gsm8k.html",
    "accuracy": None,  # prints its table; writes only with --summary-md
    "circuits": "runs/circuits/figures/circuits_induction_agreement.html",
    "export": "runs/export/topk.parquet",
    "graph": "runs/graph/graph.html",
    "replicate": "runs/replicate/figures",
    "groundtruth": "runs/groundtruth/figures/groundtruth_auroc.html",
}


def test_every_command_is_covered():
    """A new subcommand gets a row here (``figures`` is the one that rewrites figures/;
    it has its own test below)."""
    assert set(SUBCOMMANDS) - {"figures"} == set(WRITES), "add the new command to WRITES"


@pytest.mark.parametrize("command", sorted(WRITES))
def test_default_outputs_leave_git_status_clean(command, checkout, models, capsys):
    if command == "groundtruth":
        from cwlens.groundtruth import library

        if "frac_prevs" not in library.names():
            pytest.skip("the shipped program frac_prevs is not built yet")
    argv = _commands(*models)[command]
    assert main(argv) == 0, capsys.readouterr().err
    status = _git(checkout, "status", "--porcelain", "--untracked-files=all")
    assert status == "", f"cwlens {command} changed the checkout:\n{status}"
    # nor anything git ignores outside runs/ (figures/*.html is ignored, figures/ is not ours)
    ignored = _git(checkout, "status", "--porcelain", "--ignored", "--untracked-files=all")
    outside = [line for line in ignored.splitlines() if not line.startswith("!! runs/")]
    assert outside == [], f"cwlens {command} wrote outside runs/:\n" + "\n".join(outside)
    if WRITES[command]:
        assert (checkout / WRITES[command]).exists(), sorted(map(str, checkout.rglob("*")))
    for rel in TRACKED:
        assert (checkout / rel).read_text() == f"tracked {rel}\n"


def test_figures_flag_names_the_repository_folder(checkout, models, capsys):
    """``--figures figures`` is how a run rewrites the tracked figures, on purpose."""
    lm, _ = models
    argv = ["circuits", "--model", lm, "--device", "cpu", "--task", "induction", "--prompts",
            "2", "--length", "3", "--k", "3", "--no-png", "--figures", "figures"]
    assert main(argv) == 0
    assert (checkout / "figures" / "circuits_induction_token_flow.html").is_file()
    assert not (checkout / "runs" / "circuits" / "figures").exists()


def test_cwlens_figures_writes_figures_only(checkout, models, capsys):
    """``cwlens figures`` is the command that redraws figures/ (here the demo step)."""
    lm, _ = models
    assert main(["figures", "--model", lm, "--device", "cpu", "--only", "demo", "--no-png"]) == 0
    assert (checkout / "figures" / "demo_attention_vs_contribution.html").is_file()
    assert not (checkout / "runs").exists()


def _title(html: Path) -> str:
    import json
    import re

    text = html.read_text()
    # plotly writes the layout as JSON: the figure's title text
    found = re.findall(r'"title":\{"text":"((?:[^"\\]|\\.)*)"', text)
    return " | ".join(json.loads(f'"{t}"') for t in found)


def test_figure_titles_say_what_they_were_made_from(checkout, models, capsys):
    """Model, data and n in each figure's title: a 2-sample figure reads as one."""
    lm, _ = models
    cmds = _commands(*models)
    for name in ("faithfulness", "sinks", "circuits", "demo"):
        assert main(cmds[name]) == 0
    faith = _title(checkout / "runs/faithfulness/figures/faithfulness_gsm8k.html")
    assert "gsm8k" in faith and lm in faith and "n = 2 samples" in faith, faith
    sinks = _title(checkout / "runs/sinks/figures/sinks_factor_split.html")
    assert "2 gsm8k texts" in sinks and "first 12 tokens" in sinks, sinks
    agree = _title(checkout / "runs/circuits/figures/circuits_induction_agreement.html")
    assert lm in agree and "induction (2 prompts)" in agree, agree
    flow = _title(checkout / "runs/circuits/figures/circuits_induction_token_flow.html")
    assert lm in flow and "induction prompt 0 of 2" in flow, flow
    demo = _title(checkout / "runs/demo/demo_attention_vs_contribution.html")
    assert lm in demo and "GSM8K problem 0" in demo and "first 12 tokens" in demo, demo
