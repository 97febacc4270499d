"""The cross-model table of the paper's claims, read from ``cwlens replicate`` folders.

One row per claim, one column per model; each cell gives the measured numbers and, where
the claim is an order, a verdict from a paired bootstrap (:mod:`cwlens.faithfulness.aopc`).
A stage that has not run (or does not apply: the sink-norm intervention and the
gradient metrics need a next-token loss, which an encoder has not) reads "n/a" with the
reason. Nothing here computes on a model: every number comes from the files.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cwlens.faithfulness import aopc as A
from cwlens.replication import plan


@dataclass
class ModelResults:
    """What one model's folder holds (None where a stage has not run)."""

    name: str
    encoder: bool
    measure: str
    aopc: pd.DataFrame | None = None  # aopc.aopc_summary
    per_sample: pd.DataFrame | None = None  # aopc.aopc per sample
    curves: pd.DataFrame | None = None  # aopc.curve_summary
    verdicts: dict | None = None
    sinks: dict | None = None  # summary.json
    alignment_layers: pd.DataFrame | None = None
    sink_ppl: pd.DataFrame | None = None  # per sample, target, scale: nll_sum, n_tokens
    n_layers: int | None = None
    token_classes: pd.DataFrame | None = None
    per_layer: pd.DataFrame | None = None  # per-layer damage rows


def load(out, name: str, n_boot: int = 2000) -> ModelResults:
    """Read ``<out>/<name>`` (see :mod:`cwlens.replication.plan` for the layout)."""
    from cwlens.faithfulness import read_results

    folder = plan.model_dir(out, name)
    enc_path = folder / plan.ENCODER_FAITHFULNESS
    encoder = enc_path.exists()
    res = ModelResults(name, encoder, "embedding_damage" if encoder else "delta_nll")
    path = enc_path if encoder else folder / plan.FAITHFULNESS
    if path.exists():
        table = read_results(path)
        if len(table):
            d = A.damages(table, res.measure)
            res.per_sample = A.aopc(d)
            res.aopc = A.aopc_summary(res.per_sample, n_boot=n_boot)
            res.curves = A.curve_summary(d, n_boot=n_boot)
            res.verdicts = A.verdicts(res.per_sample, n_boot=n_boot)
    sink_dir = folder / plan.SINKS
    if (sink_dir / "summary.json").exists():
        res.sinks = json.loads((sink_dir / "summary.json").read_text())
        al = pd.read_csv(sink_dir / "alignment_layers.csv")
        res.alignment_layers = al
        res.n_layers = int(al["layer"].max()) + 1
        if (sink_dir / "ppl.csv").exists():
            res.sink_ppl = pd.read_csv(sink_dir / "ppl.csv")
    if (folder / plan.TOKEN_CLASSES).exists():
        res.token_classes = pd.read_csv(folder / plan.TOKEN_CLASSES)
    if (folder / plan.PER_LAYER).exists():
        t = read_results(folder / plan.PER_LAYER)
        if len(t):
            res.per_layer = A.damages(t, "delta_nll")
    return res


NA = "n/a"


def _delta(res: ModelResults, metric: str) -> str:
    """``comp Δ / suff Δ`` of ``metric`` against signed contribution (AOPC scores)."""
    if res.aopc is None:
        return NA + " (not run)"
    if metric not in set(res.aopc["metric"]):
        return NA + (" (needs a next-token loss)" if res.encoder else " (not run)")
    parts = []
    for mode, tag in (("comprehensiveness", "comp"), ("sufficiency", "suff")):
        r = res.aopc[(res.aopc["metric"] == metric) & (res.aopc["mode"] == mode)].iloc[0]
        word = ("better" if r.delta > 0 else "worse") if r.resolved else "tie"
        parts.append(f"{tag} {r.delta:+.3f} [{r.delta_low:+.3f}, {r.delta_high:+.3f}] ({word})")
    return "; ".join(parts)


def _ranking(res: ModelResults) -> str:
    """The label-free metrics (random excluded) from most to least faithful by mean AOPC."""
    from cwlens.metrics import REGISTRY

    if res.aopc is None:
        return NA + " (not run)"
    free = [m for m in REGISTRY if not REGISTRY[m].supervised and m != "random"]
    return "; ".join(f"{tag}: {A.ranking_line(res.aopc, mode, free)}"
                     for mode, tag in (("comprehensiveness", "comp"), ("sufficiency", "suff")))


def _verdict(res: ModelResults, mode: str, variant: str) -> str:
    if res.verdicts is None:
        return NA + " (not run)"
    return res.verdicts.get((mode, variant), NA)


def _sink_vs_contribution(res: ModelResults) -> str:
    s = res.sinks
    if s is None:
        return NA + " (not run)"
    text = (f"layer mean: attention {s['layer_mean_sink_attention']:.3f} vs share of output "
            f"{s['layer_mean_sink_contribution']:.3f}; ")
    if not s["n_sink_heads"]:
        return text + f"no sink heads (mean rate > {s['eps']:g}) among {s['n_heads']}"
    return text + (f"sink heads ({s['n_sink_heads']} of {s['n_heads']}): rate "
                   f"{s['sink_heads_mean_rate']:.3f} vs contribution "
                   f"{s['sink_heads_mean_contribution']:.3f}")


def _anti_alignment(res: ModelResults) -> str:
    """Mean cos(sink value, tail values) and % negative in the first, middle and last third
    of the layers."""
    al = res.alignment_layers
    if al is None:
        return NA + " (not run)"
    v = al[al["measure"] == "value"].sort_values("layer")
    thirds = [v[v["layer"] * 3 // res.n_layers == k] for k in range(3)]
    return "; ".join(
        f"{name} (layers {g['layer'].min()}-{g['layer'].max()}) {g['mean'].mean():+.2f} "
        f"({100 * g['frac_negative'].mean():.0f}% < 0)"
        for name, g in zip(("early", "middle", "late"), thirds, strict=True) if len(g))


def _observed(res: ModelResults) -> str:
    """Shares of heads by the shape of their binned means (interior: a resolved fall, then
    a resolved rise; :mod:`cwlens.sinks.observed_shape`), with the quadratic's share."""
    s = res.sinks
    if s is None or "observed_heads" not in s:
        return NA + " (not run)"
    if "observed_falling_frac_heads" not in s:
        return NA + " (sinks summary from before the binned rule: re-run cwlens sinks)"
    bins = s["observed_norm_rel_by_bin"]
    first, last = next(iter(bins)), list(bins)[-1]
    pct = {k: 100 * s[f"observed_{k}_frac_heads"] for k in ("interior", "falling", "rising", "flat")}
    return (f"rule: interior = resolved fall, then resolved rise of the binned mean norm "
            f"(Bonferroni z over bin pairs); of {s['observed_heads']} heads: interior "
            f"{pct['interior']:.0f}%, falling {pct['falling']:.0f}%, rising {pct['rising']:.0f}%, "
            f"flat {pct['flat']:.0f}%, too few points {100 * s['observed_undetermined_frac_heads']:.0f}% "
            f"(a quadratic's vertex: interior "
            f"{100 * s['observed_quad_interior_frac_heads']:.0f}%, not a test); median "
            f"corr(rate, norm) {s['observed_corr_median']:+.2f}; relative norm "
            f"{bins[first]:.2f} (rate {first}) → {bins[last]:.2f} (rate {last})")


def _intervention(res: ModelResults) -> str:
    s = res.sinks
    if s is None:
        return NA + " (not run)"
    if "ppl" not in s:
        return NA + " (needs a next-token loss)" if res.encoder else NA + " (not run)"
    sink, rnd = s["ppl"].get("sink@0"), s["ppl"].get("random@0")
    text = f"ΔPPL sink value zeroed {sink[1]:+.2f} vs random position {rnd[1]:+.2f}"
    if res.sink_ppl is not None:
        from cwlens.bootstrap import paired_bootstrap

        p = res.sink_ppl[res.sink_ppl["scale"] == 0.0].assign(
            nll=lambda f: f["nll_sum"] / f["n_tokens"]).pivot(index="sample", columns="target",
                                                               values="nll")
        d = paired_bootstrap(p["random"].to_numpy(), p["sink"].to_numpy())
        text += (f" (per-text ΔNLL sink − control {d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}], "
                 f"{'resolved' if d.sign else 'unresolved'})")
    if "cone_low_after_sink" in s:
        text += (f"; cone cosine of low-norm heads {s['cone_low_before_sink']:+.2f} → "
                 f"{s['cone_low_after_sink']:+.2f} (control → "
                 f"{s.get('cone_low_after_random', float('nan')):+.2f})")
    return text


def _token_classes(res: ModelResults, cls: str) -> str:
    t = res.token_classes
    if t is None:
        return NA + " (not run)"
    g = t[t["token_class"] == cls]
    if not len(g) or g["n_keys"].sum() == 0:
        return NA + " (none in the texts)"
    other = t[t["token_class"] == "other"]
    return (f"attention {g['attention'].mean():.3f} vs norm-weighted {g['norm_weighted'].mean():.3f}"
            f" (uniform {g['key_frac'].mean():.3f}); ‖ṽ‖/‖o‖ {g['mean_relative_norm'].mean():.2f}"
            f" vs {other['mean_relative_norm'].mean():.2f} for other tokens")


def _layer_wins(comp: pd.DataFrame, a: str, b: str) -> tuple[int, int, int]:
    """``(b more damaging, b less, layers)``: per layer, the paired 95% comparison of ``b``
    against ``a`` (per-sample damage)."""
    from cwlens.bootstrap import paired_frame_difference

    layers = sorted(set(comp["layers"]), key=int)
    more = less = 0
    for ly in layers:
        cell = comp[comp["layers"] == ly].rename(columns={"damage": "value"})
        diff = paired_frame_difference(cell, "metric", a, b)
        more += diff.sign > 0
        less += diff.sign < 0
    return more, less, len(layers)


def _per_layer(res: ModelResults) -> str:
    d = res.per_layer
    if d is None:
        return NA + " (not run for this model)"
    comp = d[d["mode"] == "comprehensiveness"]
    more, less, n = _layer_wins(comp, "attention", "contribution")
    text = (f"rate {float(comp['rate'].iloc[0]):g}, one layer at a time, comprehensiveness: "
            f"contribution > attention in {more} of {n} layers, < in {less} (paired 95%)")
    if "alti" in set(comp["metric"]):
        more, less, n = _layer_wins(comp, "contribution", "alti")
        text += f"; ALTI > contribution in {more}, < in {less}"
    means = comp[comp["metric"] == "contribution"].groupby("layers")["damage"].mean()
    return text + f"; most damaging layer {means.idxmax()} (ΔNLL {means.max():.2f})"


CLAIMS = (
    ("Hierarchy, comprehensiveness, signed c", "attn < vw < vwon < contrib",
     lambda r: _verdict(r, "comprehensiveness", "signed")),
    ("Hierarchy, sufficiency, signed c", "attn < vw < vwon < contrib",
     lambda r: _verdict(r, "sufficiency", "signed")),
    ("Hierarchy, comprehensiveness, \\|c\\|", "attn < vw < vwon < \\|c\\|",
     lambda r: _verdict(r, "comprehensiveness", "abs")),
    ("Hierarchy, sufficiency, \\|c\\|", "attn < vw < vwon < \\|c\\|",
     lambda r: _verdict(r, "sufficiency", "abs")),
    ("Label-free metrics, most to least faithful (AOPC means)", "contrib first",
     _ranking),
    ("ALTI (peer) vs signed c: AOPC score Δ", "(not in the paper)", lambda r: _delta(r, "alti")),
    ("attention × gradient (supervised) vs signed c", "(not in the paper)",
     lambda r: _delta(r, "attention_gradient")),
    ("\\|attention × gradient\\| (supervised) vs signed c", "(not in the paper)",
     lambda r: _delta(r, "attention_gradient_abs")),
    ("Sink: attention vs contribution", "the first token gets much attention but contributes little",
     _sink_vs_contribution),
    ("Anti-alignment by depth: cos(sink value, tail values)",
     "negative: the sink's value opposes the semantic tokens'",
     _anti_alignment),
    ("Observed sink rate → head-output norm",
     "convex, minimum at an intermediate sink rate (not at 1)",
     _observed),
    ("Sink-norm intervention vs control",
     "removing the sink's value norm raises PPL and collapses low-norm heads into the semantic cone",
     _intervention),
    ("First token ([CLS]/BOS): attention vs norm-weighted", "much attention, small norm-weighted share "
     "(Kobayashi et al. 2020)", lambda r: _token_classes(r, "cls")),
    ("[SEP]/EOS: attention vs norm-weighted", "same", lambda r: _token_classes(r, "sep")),
    ("Punctuation: attention vs norm-weighted", "same", lambda r: _token_classes(r, "punctuation")),
    ("Per-layer masking (comprehensiveness)", "(protocol option)", _per_layer),
)


def claims_table(results: list[ModelResults]) -> str:
    """The markdown table: claim, what the paper says, one column per model."""
    head = "| claim | paper | " + " | ".join(r.name for r in results) + " |"
    lines = [head, "|---|---|" + "---|" * len(results)]
    for claim, paper, cell in CLAIMS:
        cells = [cell(r).replace("|", "\\|") for r in results]
        lines.append(f"| {claim} | {paper} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def aopc_tables(results: list[ModelResults]) -> str:
    """Each model's AOPC table (:func:`cwlens.faithfulness.aopc.markdown`)."""
    parts = []
    for r in results:
        if r.aopc is None:
            continue
        task = ("sentence-embedding damage, FineWeb-Edu sentences" if r.encoder
                else "language modelling, FineWeb-Edu documents")
        parts.append(f"**{r.name}** ({task})\n\n" + A.markdown(r.aopc, r.measure, r.verdicts))
    return "\n".join(parts)


def write_figures(results: list[ModelResults], folder, png: bool = True) -> list[Path]:
    """``replicate_aopc_<model>.html/.png``: each model's perturbation curves, and
    ``replicate_per_layer_<model>`` where a per-layer run exists."""
    from cwlens.plotting.export import save_figure
    from cwlens.plotting.faithfulness import aopc_curves, per_layer_curves

    written: list[Path] = []
    for r in results:
        if r.curves is None:
            continue
        task = "sentence-embedding damage" if r.encoder else "FineWeb-Edu language modelling"
        fig = aopc_curves(r.curves, r.aopc, f"{r.name}: {task} under value masking",
                          A.UNITS[r.measure])
        stem = plan.model_dir("", r.name).name
        written += save_figure(fig, Path(folder) / f"replicate_aopc_{stem}", png=png)
        if r.per_layer is not None:
            fig = per_layer_curves(r.per_layer, f"{r.name}: one layer masked at a time",
                                   A.UNITS["delta_nll"])
            written += save_figure(fig, Path(folder) / f"replicate_per_layer_{stem}", png=png)
    return written


START, END = "<!-- replication:start -->", "<!-- replication:end -->"
