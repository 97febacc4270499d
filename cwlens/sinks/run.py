"""The whole sink analysis on a model and a dataset sample: tables (CSV), figures, summary.

Used by ``cwlens sinks``. Texts are tokenized alone, truncated to ``max_tokens``,
sorted by length (less padding), left-padded in batches; the sink of each row is its
first real token. Every table carries the dataset sample id.
"""

import json
from pathlib import Path

import pandas as pd

from cwlens.errors import CwlensError
from cwlens.results_io import atomic_write, atomic_write_text, results_lock
from cwlens.sinks import alignment, norm_intervention, observed, statistics, sweep

TABLES = {
    "stats": "sink_stats.csv",  # per sample, layer, head
    "heads": "sink_heads.csv",  # per layer, head (mean over samples)
    "layers": "sink_layers.csv",  # per layer
    "alignment": "alignment.csv",  # per sample, layer, head
    "histograms": "alignment_histograms.csv",  # per layer, measure, bin
    "alignment_layers": "alignment_layers.csv",  # per layer, measure
    "sweep": "sweep.csv",  # per sample, layer, head (head -1: layer output)
    "curves": "sweep_curves.csv",  # per layer, head, s (mean curve)
    "ppl": "ppl.csv",  # per sample, target, scale
    "ppl_summary": "ppl_summary.csv",  # per target, scale
    "norm": "norm_intervention.csv",  # per target, scale, layer
    "observed": "observed_bins.csv",  # per layer, head, sink-rate bin (sufficient sums)
    "observed_heads": "observed_heads.csv",  # per layer, head: quadratic fit, minimum
    "observed_layers": "observed_layers.csv",  # per layer: pooled relative-norm fit
}


def batches(model, samples, max_tokens: int, batch_size: int):
    """``[(ids, tokens, mask)]`` with texts sorted by token length."""
    from cwlens.batching import context_cap, pad_batch, token_ids

    rows = [(s.id, token_ids(model, s.text, truncate=False)) for s in samples]
    cap = context_cap(model, max_tokens, [len(r[1]) for r in rows])
    rows = [(i, ids[:cap]) for i, ids in rows]
    rows.sort(key=lambda r: len(r[1]))
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        tokens, mask = pad_batch(model, [r[1] for r in chunk])
        out.append(([r[0] for r in chunk], tokens, mask))
    return out


RAW_PARTS = ("stats", "alignment", "histograms", "sweep", "curves", "observed", "ppl", "norm")
RAW_DIR = "raw"  # <out>/raw/batch-00000.json: one file per finished batch
MANIFEST = "tables.json"  # written after every table: {file name: sha256}


class SinkResultsError(CwlensError, ValueError):
    """A sinks results folder that is incomplete, corrupt, or from another configuration."""


def analyse_batch(model, bi: int, ids, tokens, mask, scales=(0.0, 0.5), eps: float = statistics.EPS_GU,
                  intervention: bool = True, seed: int = 0, swept_batches: int = 1) -> dict[str, pd.DataFrame]:
    """The raw tables (:data:`RAW_PARTS`) of batch ``bi``: per-sample rows, and per-batch
    histogram counts, mean curves and head measures (combined over batches by :func:`derive`).

    One streamed forward pass: each layer's geometry is built once and every analysis reads
    it while the model runs (no cache of every layer's pattern)."""
    from cwlens import adapter
    from cwlens.streaming import stream_geometry

    causal = not adapter.is_encoder(model)
    # the swept check (recomputing norms from the changed pattern) on the first batch;
    # the closed form on all of them
    _, per_layer = stream_geometry(
        model, tokens,
        lambda ly, geo: _layer_tables(geo, ly, mask, ids, eps, bi < swept_batches, causal),
        attention_mask=mask,
    )
    parts = {k: pd.concat([t[k] for t in per_layer], ignore_index=True) for k in per_layer[0]}
    if intervention:
        parts["ppl"], parts["norm"] = norm_intervention.sink_norm_intervention(
            model, tokens, mask, scales=scales, seed=seed + bi, sample_ids=ids
        )
    return parts


def _check_model(model, intervention: bool) -> None:
    """Fail before any compute, not at the first intervention."""
    if intervention:
        from cwlens import adapter

        adapter.require_next_token_model(
            model, "The sink-norm intervention",
            "Run the sink analysis with --no-intervention (intervention=False) on encoders.",
        )


def derive(parts: dict[str, list[pd.DataFrame]], eps: float = statistics.EPS_GU) -> dict[str, pd.DataFrame]:
    """All tables of :data:`TABLES` from the raw tables of every batch, in batch order."""
    t = {k: pd.concat(v, ignore_index=True) for k, v in parts.items() if v}
    t["heads"] = statistics.head_summary(t["stats"], eps)
    t["layers"] = statistics.layer_summary(t["stats"], eps)
    t["histograms"] = t["histograms"].groupby(
        ["layer", "measure", "bin_left", "bin_right"], as_index=False
    )["count"].sum()
    t["alignment_layers"] = alignment.histogram_summary(t["histograms"])
    t["curves"] = sweep.curve_summary(t["curves"])
    t["observed"] = observed.combine_bins(t["observed"])
    t["observed_heads"] = observed.head_fits(t["observed"])
    t["observed_layers"] = observed.layer_fits(t["observed"])
    if "ppl" in t:
        t["ppl_summary"] = norm_intervention.ppl_summary(t["ppl"])
        t["norm"] = norm_intervention.head_summary(t["norm"])
    return t


def analyse(
    model,
    samples,
    max_tokens: int = 128,
    batch_size: int = 8,
    scales=(0.0, 0.5),
    eps: float = statistics.EPS_GU,
    intervention: bool = True,
    seed: int = 0,
    progress: bool = True,
    swept_batches: int = 1,
) -> dict[str, pd.DataFrame]:
    """All tables of :data:`TABLES` for ``samples`` (a list of ``TextSample``), in memory
    (:func:`run_to_folder` does the same with a resumable store on disk)."""
    from tqdm.auto import tqdm

    from cwlens import validation
    from cwlens.errors import EmptyInputError

    validation.max_tokens(max_tokens)
    validation.positive_int(batch_size, "batch_size")
    if not samples:
        raise EmptyInputError("No samples to analyse: pass at least one text.")
    _check_model(model, intervention)
    parts: dict[str, list[pd.DataFrame]] = {k: [] for k in RAW_PARTS}
    todo = batches(model, samples, max_tokens, batch_size)
    for bi, (ids, tokens, mask) in enumerate(tqdm(todo, desc="sinks", unit="batch", disable=not progress)):
        for k, v in analyse_batch(model, bi, ids, tokens, mask, scales, eps, intervention, seed,
                                  swept_batches).items():
            parts[k].append(v)
    return derive(parts, eps)


def _frame_to_json(df: pd.DataFrame) -> dict:
    """Exact JSON form of a table: Python floats are written with repr (round trip)."""
    return {"columns": list(df.columns), "dtypes": [str(d) for d in df.dtypes],
            "data": [df[c].tolist() for c in df.columns]}


def _frame_from_json(obj: dict) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(v, dtype=d) for c, d, v in
                         zip(obj["columns"], obj["dtypes"], obj["data"], strict=True)})


class RawStore:
    """``<out>/raw/``: ``config.json`` and one ``batch-<k>.json`` per finished batch
    (written atomically: a batch is done iff its file exists). Batches are fixed by the
    configuration, so a resumed run computes exactly the numbers of an uninterrupted one.
    Files of separate batches never collide, so processes can share the folder, each
    taking its own batches."""

    def __init__(self, out_dir, config: dict, resume: bool = True):
        self.dir = Path(out_dir) / RAW_DIR
        self.config = json.loads(json.dumps(config))
        cfg_path = self.dir / "config.json"
        if self.dir.exists() and not resume:
            for p in self.dir.glob("*.json"):
                p.unlink()
        elif cfg_path.exists():
            old = json.loads(cfg_path.read_text())
            if old != self.config:
                diff = sorted(k for k in set(old) | set(self.config) if old.get(k) != self.config.get(k))
                raise SinkResultsError(
                    f"{out_dir} holds a sinks run with another configuration (differs in "
                    f"{', '.join(diff)}). Use another --out, or --no-resume to start it afresh.")
        self.dir.mkdir(parents=True, exist_ok=True)
        if not cfg_path.exists() or json.loads(cfg_path.read_text()) != self.config:
            atomic_write_text(cfg_path, json.dumps(self.config, indent=1, sort_keys=True))

    def path(self, bi: int) -> Path:
        return self.dir / f"batch-{bi:05d}.json"

    def done(self, bi: int, ids) -> bool:
        p = self.path(bi)
        if not p.exists():
            return False
        try:
            return json.loads(p.read_text())["ids"] == list(ids)
        except (ValueError, KeyError):
            return False  # unreadable: recompute it

    def write(self, bi: int, ids, parts: dict[str, pd.DataFrame]) -> None:
        obj = {"batch": bi, "ids": list(ids), "parts": {k: _frame_to_json(v) for k, v in parts.items()}}
        atomic_write_text(self.path(bi), json.dumps(obj))

    def load(self, n_batches: int) -> dict[str, list[pd.DataFrame]]:
        parts: dict[str, list[pd.DataFrame]] = {k: [] for k in RAW_PARTS}
        for bi in range(n_batches):
            obj = json.loads(self.path(bi).read_text())
            for k, v in obj["parts"].items():
                parts[k].append(_frame_from_json(v))
        return parts


def run_to_folder(
    model,
    samples,
    out_dir,
    max_tokens: int = 128,
    batch_size: int = 8,
    scales=(0.0, 0.5),
    eps: float = statistics.EPS_GU,
    intervention: bool = True,
    seed: int = 0,
    progress: bool = True,
    swept_batches: int = 1,
    resume: bool = True,
    model_name: str | None = None,
    on_batch=None,
) -> dict[str, pd.DataFrame]:
    """:func:`analyse` with every batch saved as it finishes (:class:`RawStore`), resumed
    on a rerun, and the derived tables written atomically from the store at the end
    (:func:`save_tables`), all under the folder lock
    (:func:`cwlens.results_io.results_lock`). ``on_batch(bi)`` runs after each saved batch.

    In a torchrun job (:mod:`cwlens.distributed`) every rank checks that all computed the
    same configuration, rank 0 opens the store (``resume=False`` empties it) and says
    which batches are missing, those are dealt round-robin over the ranks (each batch is
    the batch of a one-process run), and after a barrier rank 0 writes the tables; every
    rank returns them."""
    from cwlens import distributed

    _check_model(model, intervention)
    distributed.require_session()
    samples = list({s.id: s for s in reversed(samples)}.values())[::-1]  # one per id
    todo = batches(model, samples, max_tokens, batch_size)
    config = {"model": model_name or getattr(model.cfg, "model_name", "model"),
              "samples": [s.id for s in samples], "max_tokens": max_tokens, "batch_size": batch_size,
              "scales": [float(x) for x in scales], "eps": eps, "intervention": intervention,
              "seed": seed, "swept_batches": swept_batches}
    with results_lock(out_dir):
        distributed.agree(config, "sinks configuration")
        opened: dict = {}

        def first():
            opened["store"] = RawStore(out_dir, config, resume)
            return [bi for bi, (ids, _, _) in enumerate(todo) if not opened["store"].done(bi, ids)]

        missing = distributed.on_main(first)
        store = opened.get("store") or RawStore(out_dir, config, resume=True)
        n_done = len(todo) - len(missing)
        with distributed.JobProgress(len(todo), n_done, "sinks", "batch", enabled=progress,
                                     count=lambda: len(list(store.dir.glob("batch-*.json")))) as bar:
            for bi in distributed.shard(missing):
                ids, tokens, mask = todo[bi]
                store.write(bi, ids, analyse_batch(model, bi, ids, tokens, mask, scales, eps,
                                                   intervention, seed, swept_batches))
                bar.advance(1)
                if on_batch is not None:
                    on_batch(bi)
        distributed.barrier()  # every rank's batches are saved
        tables = derive(store.load(len(todo)), eps)
        if distributed.world().main:
            save_tables(tables, out_dir)
        distributed.barrier()
    return tables


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _layer_tables(geo, layer, mask, ids, eps, swept, causal=True) -> dict[str, pd.DataFrame]:
    """Every per-layer sink table from one layer's geometry: statistics, alignment,
    histograms, and the sink-rate sweep (``swept``: also recompute norms from the changed
    pattern, the check of the closed form; done on the first batch)."""
    mask = mask.to(geo.pattern.device)  # a model split over GPUs: this layer's device
    al, hist = alignment.layer_tables(geo, layer, mask, ids)
    s, c = sweep.layer_sweep_tables(geo, layer, mask, ids, swept=swept)
    return {"stats": statistics.layer_frame(geo, layer, mask, ids, eps, causal=causal),
            "alignment": al, "histograms": hist, "sweep": s, "curves": c,
            "observed": observed.layer_bins(geo, layer, mask)}


def _csv_writer(df: pd.DataFrame):
    def write(tmp: Path) -> None:
        df.to_csv(tmp, index=False)

    return write


def save_tables(tables: dict[str, pd.DataFrame], out_dir) -> list[Path]:
    """Write every table atomically; ``tables.json`` (their checksums) is removed first and
    written last, so a folder with a valid manifest holds one complete set of tables."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in (MANIFEST, "summary.json"):
        (out / name).unlink(missing_ok=True)
    paths = []
    for key, name in TABLES.items():
        if key in tables:
            atomic_write(out / name, _csv_writer(tables[key]))
            paths.append(out / name)
    atomic_write_text(out / MANIFEST, json.dumps({p.name: _sha256(p) for p in paths}, indent=1))
    return paths


def load_tables(out_dir) -> dict[str, pd.DataFrame]:
    """The tables of a finished run; :class:`SinkResultsError` (what is wrong, and that
    rerunning the same ``cwlens sinks`` command finishes it) if the folder holds no
    complete, intact set."""
    out = Path(out_dir)
    rerun = ("Rerun the `cwlens sinks` command that wrote it (it resumes from the saved "
             "batches and rewrites the tables), or point --out at a finished run.")
    manifest = out / MANIFEST
    if manifest.exists():
        try:
            sums = json.loads(manifest.read_text())
        except ValueError:
            raise SinkResultsError(f"{manifest} is corrupt. {rerun}") from None
        bad = [n for n, h in sums.items() if not (out / n).exists() or _sha256(out / n) != h]
        if bad:
            raise SinkResultsError(f"{out}: tables {', '.join(bad)} are missing or changed since the "
                                   f"run wrote them. {rerun}")
        names = {k: n for k, n in TABLES.items() if n in sums}
    elif (out / RAW_DIR).exists():
        raise SinkResultsError(f"{out} holds an unfinished sinks run (no {MANIFEST}). {rerun}")
    else:  # tables written before the manifest existed
        names = {k: n for k, n in TABLES.items() if (out / n).exists()}
    missing = [TABLES[k] for k in ("stats", "heads", "layers", "sweep", "curves", "histograms")
               if k not in names]
    if missing:
        raise SinkResultsError(f"{out} has no sink tables {', '.join(missing)}. {rerun}")
    tables = {}
    for k, n in names.items():
        try:
            tables[k] = pd.read_csv(out / n)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
            raise SinkResultsError(f"{out / n} is empty or corrupt ({e}). {rerun}") from None
    return tables


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
        "sink_heads_mean_contribution": float(sink_heads["sink_contribution"].mean()),
        "sink_heads_median_contribution": float(sink_heads["sink_contribution_median"].mean()),
        "sink_heads_factors": {f: float(sink_heads[f"sink_{f}"].mean()) for f in statistics.FACTORS},
        "sink_heads_tail_factors": {f: float(sink_heads[f"tail_{f}"].mean()) for f in statistics.FACTORS},
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
    return out


def read_run_info(out_dir) -> dict:
    """``model``, ``model_label``, ``dataset``, ``max_tokens`` from an earlier summary.json."""
    path = Path(out_dir) / "summary.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    return {k: old[k] for k in ("model", "model_label", "dataset", "max_tokens") if k in old}


def write_summary(summary: dict, out_dir) -> Path:
    return atomic_write_text(Path(out_dir) / "summary.json", json.dumps(summary, indent=2))


def format_summary(s: dict) -> str:
    """The printed summary of ``cwlens sinks``."""
    f, tf = s["sink_heads_factors"], s["sink_heads_tail_factors"]
    lines = [
        f"\nsink summary ({s['n_samples']} texts; the sink is the first real token)",
        f"  sink heads (mean rate > {s['eps']}): {s['n_sink_heads']} of {s['n_heads']}",
        f"  per layer: sink attention {s['layer_mean_sink_attention']:.3f} vs sink share of the "
        f"layer output {s['layer_mean_sink_contribution']:.3f} (means over layers)",
        f"  sink heads: sink rate {s['sink_heads_mean_rate']:.3f}, sink contribution (intra) "
        f"{s['sink_heads_mean_contribution']:.3f}",
        f"  factor split sink vs tail token: attention {f['attention']:.3f} vs {tf['attention']:.3f}, "
        f"relative norm {f['relative_norm']:.3f} vs {tf['relative_norm']:.3f}, cosine "
        f"{f['cosine']:+.3f} vs {tf['cosine']:+.3f}",
        f"  anti-alignment: cos(sink value, tail values) mean {s['cos_value_mean']:+.3f} "
        f"({100 * s['cos_value_neg']:.0f}% negative); cos(sink, tail mixture) "
        f"{s['cos_tail_mix_mean']:+.3f} ({100 * s['cos_tail_mix_neg']:.0f}% negative)",
        f"  sink-rate curve: s* interior for {100 * s['sweep_interior_frac_heads']:.0f}% of "
        f"(head, query) curves ({100 * s['sweep_interior_frac_sink_heads']:.0f}% in sink heads, "
        f"{100 * s['sweep_interior_frac_layers']:.0f}% for layer outputs); sink heads: median s* "
        f"{s['sweep_s_star_median_sink_heads']:.3f} vs actual rate "
        f"{s['sweep_actual_rate_sink_heads']:.3f}",
        f"  swept vs closed form: max relative gap {s['sweep_max_rel_error']:.1e}; convex "
        f"fraction (min) {s['sweep_convex_frac_min']:.3f} (convex by construction: the "
        "counterfactual curve is the norm of an affine map)",
    ]
    if observed.format_line(s):
        lines.append(observed.format_line(s))
    if "ppl" in s:
        lines.append("  sink-norm intervention (all layers): " + ", ".join(
            f"{k}: PPL {v[0]:.2f} ({v[1]:+.2f})" for k, v in s["ppl"].items()))
        if "cone_low_before_sink" in s:
            lines.append(
                f"  cone cosine of low-norm heads, sink value zeroed: "
                f"{s['cone_low_before_sink']:+.3f} -> {s['cone_low_after_sink']:+.3f} "
                f"(random control: -> {s.get('cone_low_after_random', float('nan')):+.3f}); "
                f"their norm x{s['norm_ratio_low_sink']:.2f} (control x"
                f"{s.get('norm_ratio_low_random', float('nan')):.2f})"
            )
    return "\n".join(lines)
