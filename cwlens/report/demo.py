"""The main job: attention vs contribution on one GSM8K problem with the offline model.

Prints, for the most sink-heavy heads, the top attended vs the top contributing tokens
and the factor split, and writes a Fig.-1-style figure (attention above, contribution
below) to ``runs/demo/`` (``out_dir``; ``cwlens figures --only demo`` redraws the
README's copy in ``figures/``).
"""

import re
from pathlib import Path

import torch

import cwlens
from cwlens.core.numerics import worst
from cwlens.datasets import load_dataset
from cwlens.plotting import attention_vs_contribution, save_figure
from cwlens.plotting.heatmaps import causal_mask
from cwlens.report.analysis import analyze_text
from cwlens.report.printed import entry_list, plain, row_top, signed, token_at


def pick_sink_heads(rates: torch.Tensor, n: int) -> list[tuple[int, int, float]]:
    """The ``n`` heads with the highest sink rate (``rates``: ``[layer, head]``), at most one
    per layer: (layer, head, rate)."""
    best_head = rates.argmax(-1)
    best_rate = rates.max(-1).values
    layers = best_rate.argsort(descending=True)[:n].tolist()
    return [(ly, int(best_head[ly]), float(best_rate[ly])) for ly in sorted(layers)]


def top_tokens(row: torch.Tensor, tokens: list[str], k: int, by_abs: bool = False,
               query: int | None = None, causal: bool = True) -> str:
    """``12:' the' +0.034, ...``: the top ``k`` of ``row`` among the keys ``query`` (default:
    the last token) sees; a decoder's keys after the query are never listed."""
    query = len(tokens) - 1 if query is None else query
    return entry_list(row_top(row, query, k, causal, by_abs), tokens)


def run_demo(
    model_name: str = "smollm2-135m",
    sample: int = 0,
    max_tokens: int = 40,
    n_heads: int = 3,
    top_k: int = 5,
    out_dir: str | Path = "runs/demo",
    png: bool = True,
    model=None,
) -> dict:
    """The demo on GSM8K problem ``sample``: ``model`` (default: ``load_model(model_name)``
    on its default device; load it yourself for another device)."""
    model = model if model is not None else cwlens.load_model(model_name)
    text = load_dataset("gsm8k", n=sample + 1)[sample].text  # type: ignore[union-attr]
    # one streamed pass: every layer's geometry built once, all 40 tokens kept (window=None)
    an = analyze_text(model, text, model_name=model_name, max_tokens=max_tokens, window=None,
                      top_k=top_k, check_intra=True, head_kind="inter")  # the layer-share story
    str_tokens = an.str_tokens

    print(f"cwlens demo — model {model_name}, GSM8K sample {sample}, first {len(str_tokens)} tokens")
    print(f"text: {text[:160]!r}...")
    print(
        "checks: inter-head weights sum to 1 within "
        f"{an.sum_error:.1e}; intra rows within "
        f"{an.intra_sum_error:.1e}; heads x keys rebuild "
        f"the attention output within {worst(an.closure_error):.1e} (relative)"
    )
    q = len(str_tokens) - 1
    sink_att = an.last_query["attention"][:, :, 0].mean(-1)  # [layer]: mean over heads
    sink_con = an.last_query["contribution"][:, :, 0].sum(-1)  # [layer]: share of the layer output
    print(
        f"first token, seen from the last query, averaged over the {len(sink_att)} layers: "
        f"{float(sink_att.mean()):.0%} of the heads' attention, "
        f"{float(sink_con.mean()):+.0%} of the layer's attention output"
    )
    print(
        "factor split: contribution = attention x rel.norm x cosine, with rel.norm = "
        "||v~_j|| / ||o_i|| and cosine = cos(o_i, v~_j), o_i = the layer's attention output"
    )
    print("lists: key:token and its weight, over the keys the last query sees; top contributing "
          "ranks by |contribution| (+ adds along the layer output, - opposes it)")
    parts = an  # [layer, head, query, key] factors of every token
    heads = pick_sink_heads(an.sink_rate, n_heads)
    fig_heads = []
    for layer, head, rate in heads:
        a = parts.attention[layer, head]
        c = parts.contribution[layer, head]
        rel = parts.relative_norm[layer, head]
        cos = parts.cosine[layer, head]
        share = float(c[q].sum())
        print(
            f"\nL{layer}H{head}  sink rate {rate:.2f}  (query {q}: {str_tokens[q]!r}; this head "
            f"carries {share:+.3f} of the layer output, sink alone {float(c[q, 0]):+.3f})"
        )
        print(f"  top attended:     {top_tokens(a[q], str_tokens, top_k, False, q, an.causal)}")
        print(f"  top contributing: {top_tokens(c[q], str_tokens, top_k, True, q, an.causal)}")
        print("  factor split   key:token          attention  rel.norm   cosine  contribution")
        top = [j for j, _ in row_top(c[q], q, 3, an.causal, by_abs=True) if j != 0]
        for j in [0, *top[:2]]:
            role = "sink" if j == 0 else "top"
            print(
                f"  {role:<5} {token_at(j, str_tokens):<22} {plain(a[q, j]):>9} "
                f"{plain(rel[q, j]):>9} {signed(cos[q, j]):>8} {signed(c[q, j]):>12}"
            )
        fig_heads.append(
            dict(name=f"L{layer}H{head}", attention=a.numpy(), contribution=c.numpy(),
                 relative_norm=rel.numpy(), cosine=cos.numpy())
        )

    fig = attention_vs_contribution(
        fig_heads, str_tokens,
        title=f"{model_name}, GSM8K problem {sample} (first {len(str_tokens)} tokens)<br>attention "
        "(top) vs contribution to the layer output (bottom), most sink-heavy heads",
        contribution_label="contribution (inter-head)",
        masked=causal_mask(len(str_tokens)) if an.causal else None,
    )
    paths = save_figure(fig, Path(out_dir) / "demo_attention_vs_contribution", png=png)
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return {"heads": heads, "paths": paths, "closure_error": an.closure_error}


EXCERPT_START, EXCERPT_END = "<!-- demo-excerpt:start -->", "<!-- demo-excerpt:end -->"


def readme_excerpt(printed: str) -> str:
    """The README's demo excerpt, from what :func:`run_demo` printed (``printed``): the
    checks line, the first head's line, its factor-split header and sink row, and a
    sentence read off that row (``scripts/demo_excerpt.py`` prints it: it goes into the
    README between :data:`EXCERPT_START` and :data:`EXCERPT_END`; a test compares the two)."""
    lines = printed.splitlines()
    checks = next(line for line in lines if line.startswith("checks:"))
    at = next(i for i, line in enumerate(lines) if re.match(r"L\d+H\d+  sink rate", line))
    head = lines[at]
    header = next(i for i in range(at, len(lines)) if lines[i].startswith("  factor split"))
    sink = lines[header + 1]
    numbers = sink.split()[-4:]  # attention, rel.norm, cosine, contribution
    attention, rel, cos, contribution = numbers
    name = head.split()[0]
    share = float(contribution)
    return "\n".join([
        "An excerpt of what it prints (`make demo`; SmolLM2-135M-Instruct, Q4_1 GGUF "
        "dequantized; printed from a run by `python scripts/demo_excerpt.py`):",
        "",
        "```",
        checks,
        head,
        lines[header],
        sink,
        "```",
        "",
        f"Head {name} puts {attention} of its attention on the first token, yet that token "
        f"carries {share:.1%} of the layer's attention output: its projected value is "
        f"{float(rel):.2f} of the output's norm, at cosine {cos} to it (attention x rel.norm "
        f"x cosine = contribution).",
    ])
