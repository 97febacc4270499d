"""Printed tables read without guessing (#41.5): every table of ``cwlens faithfulness`` is
followed by a one-line legend that spells out its labels (``vw``, ``vwon``, ``comp 0.1``),
and the run says why it needs fewer forward passes than it has conditions."""

import re

from cwlens.cli.main import main
from cwlens.core import metrics
from cwlens.testing import save_tiny


def test_the_legend_spells_out_every_label():
    line = metrics.legend(["value_weighted_output_normalized", "attention", "value_weighted"])
    assert line.startswith("Legend: attn = attention")  # registry order, whatever the input's
    assert "vw = value-weighted (`a_ij ||v~_j||`)" in line
    assert "vwon = value-weighted output-norm." in line and "at row scope" in line
    assert "contrib" not in line
    assert metrics.legend([]) == ""


def _tables(out: str) -> list[tuple[list[str], str]]:
    """``(row labels, the first non-empty line after the table)`` of each markdown table."""
    lines, found = out.splitlines(), []
    i = 0
    while i < len(lines):
        if lines[i].startswith("| metric |"):
            j = i + 2
            labels = []
            while j < len(lines) and lines[j].startswith("|"):
                labels.append(lines[j].split("|")[1].strip().replace("\\", ""))
                j += 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            found.append((labels, lines[j] if j < len(lines) else ""))
            i = j
        i += 1
    return found


def test_faithfulness_tables_have_legends_and_the_pass_count_is_explained(tmp_path, capsys):
    model_dir = save_tiny("llama", tmp_path)
    assert main(["faithfulness", "--model", str(model_dir), "--device", "cpu", "--dataset", "gsm8k",
                 "--samples", "3", "--rates", "0,0.1,0.3,1", "--max-tokens", "24",
                 "--out", str(tmp_path / "run"), "--no-png", "--no-progress"]) == 0
    out = capsys.readouterr().out
    tables = _tables(out)
    assert len(tables) >= 2  # the results table and the AOPC table(s)
    for labels, after in tables:
        assert after.startswith("Legend: "), after
        for label in labels:
            assert f"{label} = " in after, (label, after)
    assert "comp r / suff r: comprehensiveness / sufficiency" in out
    # 6 metrics x 2 modes x 4 rates = 48 conditions; rate 0 is the clean pass, rate 1 one
    # mask for every metric and mode, vwon masks as vw: 5 x 2 x 2 + 1 = 21 masks
    passes = re.search(r"gsm8k: (\d+) forward passes in (\d+) batches", out)
    note = re.search(r"(\d+) conditions per sample, (\d+) distinct masks \((.*)\); each batch runs "
                     r"1 clean pass \+ 1 per mask = (\d+) forward passes", out)
    assert passes and note, out[:2000]
    n_forwards, n_batches = int(passes[1]), int(passes[2])
    assert (int(note[1]), int(note[2]), int(note[4])) == (48, 21, 22)
    assert n_forwards == n_batches * 22
    assert "rate 0 is the clean pass (12 conditions)" in note[3]
    assert "rate 1 removes every entry, whatever the metric or mode (12 conditions, 1 mask)" in note[3]
    assert "vwon ranks as vw at row scope" in note[3] and "(4 conditions)" in note[3]


def test_the_circuits_tables_say_what_each_column_is():
    from cwlens import circuits
    from cwlens.testing import tiny_model

    m = tiny_model("llama")
    c = circuits.compare_with_patching(m, circuits.build_task("induction", m, length=6, n_prompts=3), k=3)
    text = c.format(top=3)
    legend = next(line for line in text.splitlines() if line.startswith("  (each cell: head as L<layer>H<head>"))
    for name, scores in c.scores.items():
        assert f"{name} = {scores.description}" in legend and scores.description
    assert "top-3 overlap: the share of patching's top 3 heads in the score's top 3" in text
