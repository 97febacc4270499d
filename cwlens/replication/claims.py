"""The cross-model table of the paper's claims, read from ``cwlens replicate`` folders.

One row per claim, one column per model; each cell gives the measured numbers and, where
the claim is an order, a verdict from a paired bootstrap (:mod:`cwlens.faithfulness.aopc`).
A stage that has not run (or does not apply: the sink-norm intervention and the
gradient metrics need a next-token loss, which an encoder has not) reads "n/a" with the
reason. Nothing here computes on a model: every number comes from the files.
"""

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cwlens.core.bootstrap import FLAG, flag_note, holm, paired_bootstrap, paired_frame_difference
from cwlens.core.metrics import HIERARCHY, REGISTRY, legend
from cwlens.faithfulness import aopc as A
from cwlens.faithfulness import read_results
from cwlens.plotting.export import save_figure
from cwlens.plotting.faithfulness import aopc_curves, per_layer_curves
from cwlens.replication import plan
from cwlens.sinks.summary import read_summary


@dataclass
class View:
    """One faithfulness file read in one parameterisation of the AOPC bins
    (:data:`cwlens.faithfulness.aopc.PARAMETERISATIONS`)."""

    parameterisation: str
    aopc: pd.DataFrame  # aopc.aopc_summary
    per_sample: pd.DataFrame  # aopc.aopc per sample
    verdicts: dict
    bins: dict  # {mode: "0.01,0.05,..."}: the removal rates averaged


@dataclass
class ModelResults:
    """What one model's folder holds (None where a stage has not run).

    ``aopc`` / ``per_sample`` / ``verdicts`` are the ``removed`` parameterisation of the
    main run (the paper's wording); ``views[(param, first_token_masked)]`` holds every
    parameterisation of both runs (the second with the first token never masked);
    ``shares``: per metric, mode and rate, the mean share of removed entries chosen by
    the tie-break and on the first token (main run)."""

    name: str
    encoder: bool
    measure: str
    aopc: pd.DataFrame | None = None  # aopc.aopc_summary
    per_sample: pd.DataFrame | None = None  # aopc.aopc per sample
    curves: pd.DataFrame | None = None  # aopc.curve_summary
    verdicts: dict | None = None
    views: dict = field(default_factory=dict)
    shares: pd.DataFrame | None = None
    sinks: dict | None = None  # summary.json
    alignment_layers: pd.DataFrame | None = None
    sink_ppl: pd.DataFrame | None = None  # per sample, target, scale: nll_sum, n_tokens
    n_layers: int | None = None
    token_classes: pd.DataFrame | None = None
    per_layer: pd.DataFrame | None = None  # per-layer damage rows


def load(out, name: str, n_boot: int = 2000) -> ModelResults:
    """Read ``<out>/<name>`` (see :mod:`cwlens.replication.plan` for the layout)."""
    folder = plan.model_dir(out, name)
    enc_path = folder / plan.ENCODER_FAITHFULNESS
    encoder = enc_path.exists()
    res = ModelResults(name, encoder, "embedding_damage" if encoder else "delta_nll")
    path = enc_path if encoder else folder / plan.FAITHFULNESS
    for first_masked, p in ((True, path), (False, path.with_name(plan.first_token_kept(path.name)))):
        table = read_results(p) if p.exists() else None
        if table is None or not len(table):
            continue
        d = A.damages(table, res.measure)
        for param in A.PARAMETERISATIONS:
            try:
                per = A.aopc_bins(d, param)
            except A.InvalidArgumentError:  # the run has none of these bins
                continue
            bins = dict(zip(per["mode"], per["bins"], strict=True))
            res.views[(param, first_masked)] = View(
                param, A.aopc_summary(per, n_boot=n_boot), per, A.verdicts(per, n_boot=n_boot), bins)
        if first_masked:
            res.curves = A.curve_summary(d, n_boot=n_boot)
            res.shares = A.mask_share_summary(table)
            main = res.views.get(("removed", True))
            if main is not None:
                res.per_sample, res.aopc, res.verdicts = main.per_sample, main.aopc, main.verdicts
    sink_dir = folder / plan.SINKS
    if (sink_dir / "summary.json").exists():
        res.sinks = read_summary(sink_dir)
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


def _delta(res: ModelResults, metric: str, param: str = "removed", first_masked: bool = True) -> str:
    """``comp Δ / suff Δ`` of ``metric`` against signed contribution (AOPC scores) in one
    parameterisation; resolved = Holm over the AOPC table's Δs."""
    view = res.views.get((param, first_masked))
    if view is None:
        return NA + (" (not run)" if first_masked or res.aopc is None else " (view not run)")
    if metric not in set(view.aopc["metric"]):
        return NA + (" (needs a next-token loss)" if res.encoder else " (not run)")
    parts = []
    for mode, tag in (("comprehensiveness", "comp"), ("sufficiency", "suff")):
        hit = view.aopc[(view.aopc["metric"] == metric) & (view.aopc["mode"] == mode)]
        if not len(hit):
            continue
        r = hit.iloc[0]
        if r.delta_low != r.delta_low:  # NaN: fewer than 3 samples, no paired test
            parts.append(f"{tag} {r.delta:+.3f} (n = {int(r.n)}: no interval, the paired test "
                         "needs 3)")
            continue
        # an interval that keeps 0 after Holm is not a tie (equality is not shown): say so
        word = ("better" if r.delta > 0 else "worse") if r.resolved else "unresolved"
        flag = FLAG if r.get("delta_flagged", False) else ""  # outside the validity range
        parts.append(f"{tag} {r.delta:+.3f} [{r.delta_low:+.3f}, {r.delta_high:+.3f}] ({word}){flag}")
    return "; ".join(parts)


def _ranking(res: ModelResults) -> str:
    """The label-free metrics (random excluded) from most to least faithful by mean AOPC."""
    if res.aopc is None:
        return NA + " (not run)"
    free = [m for m in REGISTRY if not REGISTRY[m].supervised and m != "random"]
    return "; ".join(f"{tag}: {A.ranking_line(res.aopc, mode, free)}"
                     for mode, tag in (("comprehensiveness", "comp"), ("sufficiency", "suff")))


def _verdict(res: ModelResults, mode: str, variant: str, param: str = "removed",
             first_masked: bool = True) -> str:
    view = res.views.get((param, first_masked))
    if view is None:
        return NA + " (not run)"
    text = view.verdicts.get((mode, variant), NA)
    return f"{text} (removal rates {view.bins[mode]})" if mode in view.bins else text


def _shares(res: ModelResults) -> str:
    """Mean share of removed entries chosen by the tie-break, and on the first token, per
    metric at the smallest and the largest rate (comprehensiveness), and the largest
    tie share of any metric, mode and rate."""
    t = res.shares
    if t is None or not len(t):
        return NA + " (not run)"
    comp = t[t["mode"] == "comprehensiveness"]
    lo, hi = comp["rate"].min(), comp["rate"].max()
    parts = []
    for metric in ("attention", "contribution", "alti"):
        g = comp[comp["metric"] == metric].set_index("rate")
        if len(g):
            parts.append(f"{metric}: tied {100 * g.loc[lo, 'tied_share']:.0f}% / "
                         f"{100 * g.loc[hi, 'tied_share']:.0f}%, first token "
                         f"{100 * g.loc[lo, 'first_token_share']:.0f}% / "
                         f"{100 * g.loc[hi, 'first_token_share']:.0f}%")
    worst = t.loc[t["tied_share"].idxmax()]
    return (f"comp r = {lo:g} / {hi:g}: " + "; ".join(parts)
            + f"; most ties: {worst['metric']} {worst['mode'][:4]} {worst['rate']:g} "
              f"({100 * worst['tied_share']:.0f}%)")


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
        p = res.sink_ppl[res.sink_ppl["scale"] == 0.0].assign(
            nll=lambda f: f["nll_sum"] / f["n_tokens"]).pivot(index="sample", columns="target",
                                                               values="nll")
        d = paired_bootstrap(p["random"].to_numpy(), p["sink"].to_numpy())
        text += (f" (per-text ΔNLL sink − control {d.mean:+.3f}, {len(p)} texts: no interval, "
                 "the paired test needs 3)" if d.low != d.low else
                 f" (per-text ΔNLL sink − control {d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}], "
                 f"{'resolved' if d.sign else 'unresolved'}){FLAG if d.flagged else ''}")
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
    """``(b more damaging, b less, layers)``: per layer, the paired comparison of ``b``
    against ``a`` (per-sample damage), Holm-corrected across the layers at 5%."""
    return _layer_comparison(comp, a, b)[:3]


def _layer_comparison(comp: pd.DataFrame, a: str, b: str) -> tuple[int, int, int, int]:
    """:func:`_layer_wins` and the number of layers whose differences lie outside the
    bootstrap-t's validity range (:func:`cwlens.core.bootstrap.outside_validity`)."""
    layers = sorted(set(comp["layers"]), key=int)
    tests = {ly: paired_frame_difference(comp[comp["layers"] == ly].rename(columns={"damage": "value"}),
                                         "metric", a, b) for ly in layers}
    signs = [d.sign for d in holm(tests).values()]
    flagged = sum(d.flagged for d in tests.values())
    return sum(s > 0 for s in signs), sum(s < 0 for s in signs), len(layers), flagged


def _flagged_layers(k: int, before: str = "; ", after: str = "") -> str:
    return f"{before}{FLAG} in {k} layer{'s' if k != 1 else ''}{after}" if k else ""


def _per_layer(res: ModelResults) -> str:
    d = res.per_layer
    if d is None:
        return NA + " (not run for this model)"
    comp = d[d["mode"] == "comprehensiveness"]
    more, less, n, flagged = _layer_comparison(comp, "attention", "contribution")
    text = (f"rate {float(comp['rate'].iloc[0]):g}, one layer at a time, comprehensiveness: "
            f"contribution > attention in {more} of {n} layers, < in {less} (paired bootstrap-t, "
            f"Holm across layers, 5%{_flagged_layers(flagged)})")
    if "alti" in set(comp["metric"]):
        more, less, n, flagged = _layer_comparison(comp, "contribution", "alti")
        text += f"; ALTI > contribution in {more}, < in {less}{_flagged_layers(flagged, ' (', ')')}"
    means = comp[comp["metric"] == "contribution"].groupby("layers")["damage"].mean()
    return text + f"; most damaging layer {means.idxmax()} (ΔNLL {means.max():.2f})"


CLAIMS = (
    ("Hierarchy, comprehensiveness, signed c", "attn < vw < vwon < contrib",
     lambda r: _verdict(r, "comprehensiveness", "signed")),
    ("Hierarchy, sufficiency (bottom r = 0.01..0.5 removed, the paper's wording), signed c",
     "attn < vw < vwon < contrib", lambda r: _verdict(r, "sufficiency", "signed")),
    ("Hierarchy, sufficiency (ERASER: top k = 0.01..0.5 kept), signed c",
     "attn < vw < vwon < contrib", lambda r: _verdict(r, "sufficiency", "signed", "kept")),
    ("Hierarchy, comprehensiveness, \\|c\\|", "attn < vw < vwon < \\|c\\|",
     lambda r: _verdict(r, "comprehensiveness", "abs")),
    ("Hierarchy, sufficiency (bottom r removed), \\|c\\|", "attn < vw < vwon < \\|c\\|",
     lambda r: _verdict(r, "sufficiency", "abs")),
    ("Hierarchy, sufficiency (ERASER: top k kept), \\|c\\|", "attn < vw < vwon < \\|c\\|",
     lambda r: _verdict(r, "sufficiency", "abs", "kept")),
    ("Hierarchy, first token never masked: comprehensiveness / sufficiency (ERASER), signed c",
     "attn < vw < vwon < contrib",
     lambda r: _verdict(r, "comprehensiveness", "signed", "removed", False) + " / "
     + _verdict(r, "sufficiency", "signed", "kept", False)),
    ("Label-free metrics, most to least faithful (AOPC means, bottom r removed)", "contrib first",
     _ranking),
    ("ALTI (Ferrando et al. 2022) vs signed c: AOPC score Δ (bottom r removed)",
     "(not in the paper)", lambda r: _delta(r, "alti")),
    ("ALTI vs signed c: AOPC score Δ (ERASER: top k kept)", "(not in the paper)",
     lambda r: _delta(r, "alti", "kept")),
    ("L1 proximity to the attention output only (alti_attention) vs signed c (bottom r removed)",
     "(not in the paper)", lambda r: _delta(r, "alti_attention")),
    ("Masks: removed entries chosen by the random tie-break / on the first token",
     "(protocol check)", _shares),
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
    if any(FLAG in line for line in lines):
        lines += ["", flag_note()]

    lines += ["", legend(HIERARCHY) + " |c| = the magnitude of contrib. Hierarchy rows: the "
              "paper's order, least to most faithful."]
    return "\n".join(lines) + "\n"


def aopc_tables(results: list[ModelResults]) -> str:
    """Each model's AOPC tables (:func:`cwlens.faithfulness.aopc.markdown`), one per
    parameterisation and view, each saying which it shows."""
    parts = []
    for r in results:
        task = ("sentence-embedding damage, FineWeb-Edu sentences" if r.encoder
                else "language modelling, FineWeb-Edu documents")
        for (param, first_masked), view in r.views.items():
            which = "" if first_masked else ", first token never masked"
            parts.append(f"**{r.name}** ({task}{which})\n\n"
                         + A.markdown(view.aopc, r.measure, view.verdicts,
                                      parameterisation=param, bins_used=view.bins))
        if r.shares is not None and len(r.shares):
            parts.append(f"**{r.name}** masks\n\n" + A.shares_markdown(r.shares))
    return "\n".join(parts)


def write_figures(results: list[ModelResults], folder, png: bool = True) -> list[Path]:
    """``replicate_aopc_<model>.html/.png``: each model's perturbation curves, and
    ``replicate_per_layer_<model>`` where a per-layer run exists."""
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
