"""The headline numbers of a sink run (``summary.json``) and their printed form."""

import json
import math
from os import PathLike
from pathlib import Path

import pandas as pd

from cwlens.core.bootstrap import paired_bootstrap
from cwlens.errors import InvalidArgumentError
from cwlens.runs.results_io import atomic_write_text
from cwlens.sinks import observed, statistics
from cwlens.sinks.store import SinkResultsError


def summarize(t: dict[str, pd.DataFrame], eps: float = statistics.EPS_GU) -> dict:
    """The headline numbers (what ``docs/sinks.md`` quotes)."""
    layers, heads = t["layers"], t["heads"]
    sw = t["sweep"]
    per_head = sw[sw["head"] >= 0]
    per_layer = sw[sw["head"] == -1]
    sink_heads = heads[heads["sink_head"]]
    sh_keys = set(zip(sink_heads["layer"], sink_heads["head"], strict=True))
    in_sink = per_head[[k in sh_keys for k in zip(per_head["layer"], per_head["head"], strict=True)]]
    al = t["alignment"]
    out = {
        "n_samples": int(t["stats"]["sample"].nunique()),
        "eps": eps,
        "n_sink_heads": int(len(sink_heads)),
        "n_heads": int(len(heads)),
        "layer_mean_sink_attention": float(layers["sink_rate"].mean()),
        "layer_mean_sink_contribution": float(layers["sink_token_contribution"].mean()),
        "sink_heads_mean_rate": float(sink_heads["sink_rate"].mean()),
        "sink_heads_mean_contribution": float(sink_heads["sink_contribution_intra"].mean()),
        "sink_heads_median_contribution": float(sink_heads["sink_contribution_intra_median"].mean()),
        "sink_heads_factors": {f: float(sink_heads[f"split_sink_{f}"].mean()) for f in statistics.FACTORS},
        "sink_heads_tail_factors": {f: float(sink_heads[f"split_tail_{f}"].mean()) for f in statistics.FACTORS},
        "cos_value_mean": float(al["cos_value_mean"].mean()),
        "cos_value_neg": float(al["cos_value_neg"].mean()),
        "cos_output_mean": float(al["cos_output_mean"].mean()),
        "cos_tail_mix_mean": float(al["cos_tail_mix_mean"].mean()),
        "cos_tail_mix_neg": float(al["cos_tail_mix_neg"].mean()),
        "sweep_interior_frac_heads": float(per_head["interior_frac"].mean()),
        "sweep_interior_frac_sink_heads": float(in_sink["interior_frac"].mean()),
        "sweep_interior_frac_layers": float(per_layer["interior_frac"].mean()),
        "sweep_s_star_median_sink_heads": float(in_sink["s_star_median"].median()),
        "sweep_actual_rate_sink_heads": float(in_sink["actual_rate"].mean()),
        "sweep_below_actual_frac_sink_heads": float(in_sink["below_actual_frac"].mean()),
        "sweep_norm_one_over_actual_sink_heads": float(in_sink["norm_one_over_actual"].median()),
        "sweep_norm_min_over_actual_sink_heads": float(in_sink["norm_min_over_actual"].median()),
        "sweep_max_rel_error": float(sw["swept_max_rel_error"].max()),
        "sweep_convex_frac_min": float(sw["convex_frac"].min()),
        "sweep_swept_samples": int(sw.dropna(subset=["convex_frac"])["sample"].nunique()),
    }
    if "observed" in t:
        out.update(observed.summary(t["observed"], sh_keys))
    if "ppl_summary" in t:
        ps = t["ppl_summary"]
        out["ppl"] = {f"{r.target}@{r.scale:g}": (float(r.ppl), float(r.delta_ppl))
                      for r in ps.itertuples()}
        nm = t["norm"]
        for target in ("sink", "random"):
            z = nm[(nm.target == target) & (nm.scale == 0.0)]
            if len(z):
                out[f"cone_low_before_{target}"] = float(z["cone_before_low"].mean())
                out[f"cone_low_after_{target}"] = float(z["cone_after_low"].mean())
                out[f"norm_ratio_low_{target}"] = float(z["norm_ratio_low"].mean())
                out[f"norm_ratio_all_{target}"] = float(z["norm_ratio_all"].mean())
        if "ppl" in t:
            out["sink_vs_control"] = sink_vs_control(t["ppl"])
    return out


def sink_vs_control(ppl: pd.DataFrame) -> dict:
    """Per scale, the sink against the random control text by text: ``{scale: {mean, low,
    high, n, sink_worse}}``, the paired bootstrap of the per-token NLL (``nll_sum /
    n_tokens``) of sink minus control (:func:`cwlens.core.bootstrap.paired_bootstrap`, 95%)
    and the texts where the sink's NLL is higher."""
    out = {}
    per = ppl.assign(nll=ppl["nll_sum"] / ppl["n_tokens"].clip(lower=1))
    for scale in sorted(set(per.loc[per.target == "sink", "scale"]) & set(per.loc[per.target == "random", "scale"])):
        p = per[per.scale == scale].pivot(index="sample", columns="target", values="nll")
        d = paired_bootstrap(p["random"].to_numpy(), p["sink"].to_numpy())
        out[f"{scale:g}"] = {"mean": d.mean, "low": d.low, "high": d.high, "n": int(d.n),
                             "sink_worse": int((p["sink"] > p["random"]).sum())}
    return out


RUN_INFO = ("model", "model_label", "dataset", "max_tokens")


def read_run_info(out_dir) -> dict:
    """``model``, ``model_label``, ``dataset``, ``max_tokens`` from an earlier summary.json."""
    path = Path(out_dir) / "summary.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    return {k: old[k] for k in RUN_INFO if k in old}


def to_json(summary: dict) -> str:
    """The summary as strict JSON: a number that is not finite (a mean over no sink heads)
    is written ``null``, which ``jq`` and JavaScript read; :func:`read_summary` maps it back."""
    def safe(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: safe(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [safe(v) for v in x]
        return x
    return json.dumps(safe(summary), indent=2, allow_nan=False)


def read_summary(out_dir) -> dict:
    """``out_dir/summary.json`` (or that file's path) with its ``null`` numbers as NaN again
    (the run information keeps its ``null``: ``max_tokens`` None means whole texts)."""
    def back(x):
        if x is None:
            return math.nan
        if isinstance(x, dict):
            return {k: back(v) for k, v in x.items()}
        if isinstance(x, list):
            return [back(v) for v in x]
        return x

    if not isinstance(out_dir, str | PathLike):
        raise InvalidArgumentError(
            f"read_summary takes the folder of a sink run (its --out); got {out_dir!r}.")
    path = Path(out_dir)
    path = path if path.name == "summary.json" and path.is_file() else path / "summary.json"
    if not path.is_file():
        raise InvalidArgumentError(
            f"{path} does not exist: pass the --out folder of a finished `cwlens sinks` run "
            "(a run writes summary.json last; `cwlens sinks --plot-only --out <folder> "
            "--figures <folder>` rewrites it from the tables).")
    try:
        raw = json.loads(path.read_text())
    except ValueError as e:
        raise SinkResultsError(
            f"{path} is not valid JSON ({type(e).__name__}: {e}): delete it; `cwlens sinks "
            f"--plot-only --out {path.parent} --figures <folder>` rewrites it from the tables."
        ) from None
    if not isinstance(raw, dict):
        raise SinkResultsError(f"{path} holds a {type(raw).__name__}, not a sink summary.")
    return {k: v if k in RUN_INFO else back(v) for k, v in raw.items()}


def write_summary(summary: dict, out_dir) -> Path:
    return atomic_write_text(Path(out_dir) / "summary.json", to_json(summary))


def _sink_head_lines(s: dict) -> list[str]:
    f, tf = s["sink_heads_factors"], s["sink_heads_tail_factors"]
    return [
        f"  sink heads: sink rate {s['sink_heads_mean_rate']:.3f}, sink contribution (intra) "
        f"{s['sink_heads_mean_contribution']:.3f}",
        f"  factor split sink vs tail token: attention {f['attention']:.3f} vs {tf['attention']:.3f}, "
        f"relative norm {f['relative_norm']:.3f} vs {tf['relative_norm']:.3f}, cosine "
        f"{f['cosine']:+.3f} vs {tf['cosine']:+.3f}",
    ]


def format_summary(s: dict) -> str:
    """The printed summary of ``cwlens sinks``."""
    lines = [
        f"\nsink summary ({s['n_samples']} texts{' of ' + s['dataset'] if s.get('dataset') else ''}; "
        "the sink is the first real token)",
        f"  sink heads (mean rate > {s['eps']}): {s['n_sink_heads']} of {s['n_heads']}",
        f"  per layer: sink attention {s['layer_mean_sink_attention']:.3f} vs sink share of the "
        f"layer output {s['layer_mean_sink_contribution']:.3f} (means over layers)",
        *(_sink_head_lines(s) if s["n_sink_heads"] else
          [f"  sink heads: none (no head's mean sink rate is above {s['eps']})"]),
        f"  anti-alignment: cos(sink value, tail values) mean {s['cos_value_mean']:+.3f} "
        f"({100 * s['cos_value_neg']:.0f}% negative); cos(sink, tail mixture) "
        f"{s['cos_tail_mix_mean']:+.3f} ({100 * s['cos_tail_mix_neg']:.0f}% negative)",
        f"  sink-rate curve: s* interior for {100 * s['sweep_interior_frac_heads']:.0f}% of "
        f"(head, query) curves ("
        + (f"{100 * s['sweep_interior_frac_sink_heads']:.0f}% in sink heads, " if s["n_sink_heads"] else "")
        + f"{100 * s['sweep_interior_frac_layers']:.0f}% for layer outputs)"
        + (f"; sink heads: median s* {s['sweep_s_star_median_sink_heads']:.3f} vs actual rate "
           f"{s['sweep_actual_rate_sink_heads']:.3f}" if s["n_sink_heads"] else ""),
        f"  swept vs closed form: max relative gap {s['sweep_max_rel_error']:.1e}; convex "
        f"fraction (min) {s['sweep_convex_frac_min']:.3f} (convex by construction: the "
        "counterfactual curve is the norm of an affine map)",
    ]
    if observed.format_line(s):
        lines.append(observed.format_line(s))
    if "ppl" in s:
        lines.append("  sink-norm intervention (all layers): " + ", ".join(
            f"{k}: PPL {v[0]:.2f} ({v[1]:+.2f})" for k, v in s["ppl"].items()))
        for scale, d in s.get("sink_vs_control", {}).items():
            lines.append(
                f"  per text, sink - random control at value x{scale}: mean NLL/token "
                f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] (95% paired bootstrap; "
                f"sink worse in {d['sink_worse']} of {d['n']} texts)")
        if "cone_low_before_sink" in s:
            lines.append(
                f"  cone cosine of low-norm heads, sink value zeroed: "
                f"{s['cone_low_before_sink']:+.3f} -> {s['cone_low_after_sink']:+.3f} "
                f"(random control: -> {s.get('cone_low_after_random', float('nan')):+.3f}); "
                f"their norm x{s['norm_ratio_low_sink']:.2f} (control x"
                f"{s.get('norm_ratio_low_random', float('nan')):.2f})"
            )
    return "\n".join(lines)
