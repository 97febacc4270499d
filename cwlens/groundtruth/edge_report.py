"""The per-edge study's tables (markdown), from the summary of
:func:`cwlens.groundtruth.edge_study.summarise`."""

import math

from cwlens.core.bootstrap import FLAG
from cwlens.groundtruth.edge_methods import LABELS

START = "<!-- edge-truth:{key}:start -->"
END = "<!-- edge-truth:{key}:end -->"


def _f(x: float, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def _ci(ci, signed: bool = False, fmt=None) -> str:
    fmt = fmt or _f
    return f"[{fmt(ci[0], signed)}, {fmt(ci[1], signed)}]"


def _g(x: float, signed: bool = True) -> str:
    """A drop of the objective: three decimals, or two significant digits where those
    would read 0.000 (an encoder's embedding damage is of order 1e-4)."""
    if x is not None and not (isinstance(x, float) and math.isnan(x)) and 0 < abs(x) < 5e-4:
        return f"{x:+.1e}"
    return _f(x, signed)


def command_line(args) -> str:
    parts = ["cwlens groundtruth --edges", f"--model {args.model}"]
    parts.append("--text ..." if args.text else f"--data {args.data}")
    parts.append(f"--samples {args.samples}")
    if args.text or args.data in ("gsm8k", "fineweb_edu"):
        parts.append(f"--max-tokens {args.max_tokens}")
    parts += [f"--objective {args.objective}", f"--dtype {args.dtype}"]
    if args.layers is not None:
        parts.append("--layers " + ",".join(map(str, args.layers)))
    if args.query != -1:
        parts.append(f"--query {args.query}")
    return " ".join(parts)


def markdown(s: dict) -> str:
    """The tables of one run: agreement per method, by depth, edge kinds, joint removal,
    paired differences."""
    ks = list(next(iter(s["methods"].values()))["captured"])
    cut = f", texts cut to {s['max_tokens']} tokens" if s.get("max_tokens") else ""
    lines = [f"**{s['model']}**, {s['data']}, objective `{s['objective']}`, {s['dtype']}, "
             f"{s['n_inputs']} inputs, {s['n_edges']:,} edges (query {s['query']}{cut}). "
             f"`{s.get('command', '')}`", "",
             "Per (input, layer): agreement of each method's edge weights with the true effects "
             "over the layer's edges; per input the mean over layers; mean over inputs [95% "
             f"bootstrap-t]. {FLAG}: outside the interval's validity range.", "",
             "| method | Spearman abs | Spearman signed | " + " | ".join(f"recall@{k}" for k in ks)
             + " | " + " | ".join(f"captured@{k}" for k in ks) + " |",
             "|---|---|---|" + "---|" * (2 * len(ks))]
    for m, e in s["methods"].items():
        cells = [f"{_f(e['spearman_abs'])} {_ci(e['spearman_abs_ci'])}" + (FLAG if e["spearman_abs_flagged"] else ""),
                 f"{_f(e['spearman_signed'], True)} {_ci(e['spearman_signed_ci'], True)}"
                 + (FLAG if e["spearman_signed_flagged"] else "")]
        cells += [f"{_f(e['topk_recall'][k])} {_ci(e['topk_recall_ci'][k])}" for k in ks]
        cells += [f"{_f(e['captured'][k])} {_ci(e['captured_ci'][k])}" for k in ks]
        lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + " |")
    depth = next(iter(s["methods"].values()))["by_depth"]
    lines += ["", "Spearman of magnitudes by depth (layers of each third):", "",
              "| method | " + " | ".join(f"{k} (L{v['layers'][0]}-{v['layers'][1]})" for k, v in depth.items()
                                         if v["layers"]) + " |",
              "|---|" + "---|" * sum(1 for v in depth.values() if v["layers"])]
    for m, e in s["methods"].items():
        lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(
            f"{_f(v['spearman_abs'])} {_ci(v['ci'])}" for v in e["by_depth"].values() if v["layers"]) + " |")
    kinds = list(s["kinds_truth"])
    lines += ["", "Share of |effect| (truth) and of each method's |weight| by kind of key (sink: "
              "position 0; previous: the query - 1; near: 2-8 back, or 1-8 ahead in an encoder; far: "
              "> 8 away), mean over "
              "(input, layer):", "", "| | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds),
              "| **true effect** | " + " | ".join(_f(s["kinds_truth"][k]) for k in kinds) + " |"]
    for m, e in s["methods"].items():
        lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(_f(e["kinds"][k]) for k in kinds) + " |")
    j = s["joint_removal"]
    lines += ["", "Joint removal: each method's top k edges of a layer (highest weight first) removed "
              "together; the objective's drop (mean over layers, then inputs) [95%], and in "
              "parentheses the sum of the same edges' single effects (no interaction):", "",
              "| method | " + " | ".join(f"k = {k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for m in ["oracle", *[m for m in s["methods"] if m in j]]:
        if m in j:
            label = "**largest true effects**" if m == "oracle" else LABELS.get(m, m)
            lines.append(f"| {label} | " + " | ".join(
                f"{_g(j[m][k]['drop'])} {_ci(j[m][k]['ci'], True, _g)} ({_g(j[m][k]['additive'])})"
                for k in ks) + " |")
    lines += ["", "Paired differences over inputs (Holm over the family; ✓ resolved):", "",
              "| difference | mean [95%] | p | resolved |", "|---|---|---|---|"]
    for key, d in s["paired"].items():
        fmt = _g if "joint" in key else _f
        lines.append(f"| {key} | {fmt(d['mean'], True)} {_ci(d['ci'], True, fmt)}"
                     + (FLAG if d["flagged"] else "") + f" | {d['p']:.4f} | {'✓' if d['resolved'] else ''} |")
    return "\n".join(lines) + "\n"
