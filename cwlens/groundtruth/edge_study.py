"""Every method scored against the per-edge truth over many inputs: one record per input
(:func:`measure_input`), saved as it finishes and resumed (:class:`EdgesJob`), and the
summary over inputs with bootstrap intervals and Holm-resolved paired differences
(:func:`summarise`).

Per input (one query, every chosen layer):

- per layer and method, :func:`cwlens.core.edge_scoring.agreement` of the method's weights
  with the true single-edge effects over the layer's existing edges (``a_ij > 0``), and
  the captured share for k = 1..:data:`K_CURVE` (the figure's curve);
- *joint removal*: per layer, each method's top k edges by weight (highest first: what the
  paper's masking removes) removed together, k in :data:`cwlens.core.edge_scoring.KS`,
  and the drop of the objective, next to the drop from the k edges of largest true
  single-edge effect (``oracle``) and the sum of the chosen edges' single effects
  (``additive``: the drop if edges did not interact);
- *edge kinds*: per layer, the share of ``|effect|`` and of each method's ``|weight|`` on
  the sink key (position 0), the query itself, the previous token, near keys (2 to 8
  back) and far keys (more than 8 back).

Summary: each per-input number is the mean over its layers (all, and each third of the
depth), so an input is one sample; means over inputs with bootstrap-t 95% intervals
(:mod:`cwlens.core.bootstrap`), and paired differences contribution - attention,
contribution - value-weighted, contribution - attention x gradient, resolved by Holm over
the family, flagged (``†``) where the differences' skewness lies outside the measured
validity range.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cwlens.core import bootstrap, edge_scoring
from cwlens.engine.handle import ModelHandle
from cwlens.errors import InvalidArgumentError
from cwlens.groundtruth.edge_methods import EDGE_METHODS, method_weights
from cwlens.groundtruth.edges import EdgeEffects, edge_effects, joint_effects
from cwlens.runs.jobs import Job, JobSpec, run_job
from cwlens.runs.results_io import atomic_write_text

K_CURVE = 20
SCORES = ("spearman_abs", "spearman_signed")
PAIRS = (("attention", "contribution"), ("value_weighted", "contribution"),
         ("attention_gradient", "contribution"))
KINDS = ("sink", "self", "previous", "near", "far")


@dataclass(frozen=True)
class EdgeInput:
    """One input of the study: its id, token ids ``[pos]``, query and target."""

    id: str
    tokens: torch.Tensor
    query: int = -1
    target: Any = None


def edge_kinds(query: int, n_keys: int) -> dict[str, torch.Tensor]:
    """``{kind: [n_keys] bool}`` (a key in exactly one kind; the sink wins over the others).
    Keys after the query (encoders): near up to 8 ahead (the next key included), far beyond."""
    j = torch.arange(n_keys)
    back = query - j
    kinds = {"sink": j == 0, "self": back == 0, "previous": back == 1,
             "near": ((back.abs() >= 2) | (back == -1)) & (back.abs() <= 8), "far": back.abs() > 8}
    for k in ("self", "previous", "near", "far"):
        kinds[k] = kinds[k] & ~kinds["sink"]
    return kinds


def _shares(values: torch.Tensor, ok: torch.Tensor, kinds: dict[str, torch.Tensor]) -> dict[str, float]:
    mag = values.abs().masked_fill(~ok, 0.0)
    total = float(mag.sum())
    return {k: (float(mag[:, m].sum()) / total if total > 0 else float("nan")) for k, m in kinds.items()}


def measure_input(handle: ModelHandle, item: EdgeInput, objective: str = "logprob", layers=None,
                  dtype: torch.dtype = torch.float64, methods: Sequence[str] = EDGE_METHODS,
                  ks: Sequence[int] = edge_scoring.KS) -> dict:
    """The record of one input (see the module docstring): JSON-ready."""
    fx = edge_effects(handle, item.tokens, query=item.query, target=item.target, layers=layers,
                      objective=objective, dtype=dtype)
    weights = method_weights(handle, fx, methods)
    return record_of(handle, item, fx, weights, ks)


def record_of(handle: ModelHandle, item: EdgeInput, fx: EdgeEffects, weights: dict[str, torch.Tensor],
              ks: Sequence[int] = edge_scoring.KS) -> dict:
    kinds = edge_kinds(fx.query, fx.effect.shape[-1])
    per_layer: list[dict] = []
    sets: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    labels: list[tuple[int, str, int]] = []
    additive: list[float] = []
    for li, layer in enumerate(fx.layers):
        ok = fx.eligible[li]
        e = fx.effect[li]
        heads, keys = ok.nonzero(as_tuple=True)
        row: dict[str, Any] = {"layer": layer, "n_edges": int(ok.sum()),
                               "effect_abs_sum": float(e[ok].abs().sum()),
                               "kinds_truth": _shares(e, ok, kinds), "methods": {}}
        for name, w in weights.items():
            wl = w[li]
            score = edge_scoring.agreement(wl[ok], e[ok], ks)
            score["curve"] = edge_scoring.captured_curve(wl[ok], e[ok], K_CURVE).tolist()
            score["kinds"] = _shares(wl, ok, kinds)
            row["methods"][name] = score
        for k in ks:
            kk = min(k, len(heads))
            ranked = {"oracle": e[ok]} | {n: w[li][ok] for n, w in weights.items()}
            for name, vals in ranked.items():
                if not torch.isfinite(vals).all():
                    continue
                pick = edge_scoring.top(vals, kk)
                sets.append((li, heads[pick], keys[pick]))
                labels.append((li, name, k))
                additive.append(float(e[ok][pick].sum()))
        per_layer.append(row)
    drops = joint_effects(handle, fx, sets) if sets else torch.zeros(0)
    for (li, name, k), drop, add in zip(labels, drops.tolist(), additive, strict=True):
        per_layer[li].setdefault("joint", {}).setdefault(name, {})[str(k)] = {"drop": drop, "additive": add}
    record = {"id": item.id, "n_tokens": int(fx.tokens.numel()), "query": fx.query,
              "objective": fx.objective, "clean": fx.clean,
              "target": list(fx.target) if isinstance(fx.target, tuple) else fx.target,
              "n_edges": fx.n_edges, "path": fx.path, "layers": per_layer}
    return json.loads(json.dumps(record))  # as stored: keys of k are strings


# -- the resumable run -----------------------------------------------------------------------
def item_key(item: EdgeInput) -> str:
    """8 hex digits of the input's token ids, query and target: a stored record is reused
    only for the very same input."""
    text = ",".join(map(str, item.tokens.tolist())) + f"|{item.query}|{item.target}"
    return hashlib.sha256(text.encode()).hexdigest()[:8]


class EdgesJob(Job):
    """One JSON file per input under ``<folder>/inputs``, named by its id and
    :func:`item_key` (files of separate inputs never collide, so the ranks of a torchrun
    job share the folder); a rerun skips the inputs whose file exists, so a run over the
    first n inputs of a folder that holds more reuses them (the settings in
    ``config.json`` must match: the input list is not part of them)."""

    def __init__(self, handle: ModelHandle, items: list[EdgeInput], spec: JobSpec, settings: dict):
        self.handle, self.items, self.spec, self.settings = handle, items, spec, settings

    def _path(self, item: EdgeInput) -> Path:
        return self.spec.folder / "inputs" / f"{item.id}-{item_key(item)}.json"  # type: ignore[operator]

    def open(self, resume, rank):
        folder = self.spec.folder
        if folder is None:
            self.memory: dict[str, dict] = {}
            return
        (folder / "inputs").mkdir(parents=True, exist_ok=True)
        config = folder / "config.json"
        if config.exists() and resume:
            old = json.loads(config.read_text())
            if old != self.spec.config:
                diff = sorted(k for k in set(old) | set(self.spec.config) if old.get(k) != self.spec.config.get(k))
                raise InvalidArgumentError(
                    f"{folder} holds a run with other settings ({', '.join(diff)} differ): pass "
                    "--no-resume to start it afresh, or another --out")
        if not resume:
            for f in (folder / "inputs").glob("*.json"):
                f.unlink()
        if rank in (None, 0):
            atomic_write_text(config, json.dumps(self.spec.config, indent=1, sort_keys=True))

    def survey(self):
        if self.spec.folder is None:
            return list(range(len(self.items)))
        return [i for i, it in enumerate(self.items) if not self._path(it).exists()]

    def adopt(self, view):
        self.missing = list(view)

    def todo(self):
        return self.missing

    def initial(self):
        return len(self.items) - len(self.missing)

    def counter(self):
        if self.spec.folder is None:
            return None
        folder = self.spec.folder
        return lambda: len(list((folder / "inputs").glob("*.json")))

    def do(self, index):
        item = self.items[index]
        record = measure_input(self.handle, item, **self.settings)
        if self.spec.folder is None:
            self.memory[item.id] = record
        else:
            atomic_write_text(self._path(item), json.dumps(record))
        return 1

    def merge(self):
        if self.spec.folder is None:
            return [self.memory[it.id] for it in self.items if it.id in self.memory]
        return [json.loads(self._path(it).read_text()) for it in self.items if self._path(it).exists()]


@dataclass(frozen=True)
class EdgeSettings:
    """What :func:`measure_input` measures on each input (see its arguments)."""

    objective: str = "logprob"
    layers: Any = None
    dtype: torch.dtype = torch.float64
    methods: tuple[str, ...] = EDGE_METHODS


def run_edges(handle: ModelHandle, items: list[EdgeInput], folder: str | Path | None, config: dict,
              *, resume: bool = True, progress: bool = True,
              settings: EdgeSettings | None = None) -> list[dict]:
    """Measure every input (resumable in ``folder``; torchrun shards the inputs) and return
    the records in input order."""
    spec = JobSpec("edge ground-truth configuration", config, None if folder is None else Path(folder),
                   resume, len(items), "edges", "input", progress)
    s = settings or EdgeSettings()
    kwargs = {"objective": s.objective, "layers": s.layers, "dtype": s.dtype, "methods": tuple(s.methods)}
    return run_job(EdgesJob(handle, items, spec, kwargs))


# -- the summary -----------------------------------------------------------------------------
def _nanmean(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(xs)) if xs else float("nan")


def _per_input(records: list[dict], method: str, get, layer_filter=None) -> np.ndarray:
    out = []
    for r in records:
        layers = [ly for ly in r["layers"] if layer_filter is None or layer_filter(ly["layer"])]
        out.append(_nanmean([get(ly["methods"][method]) for ly in layers if method in ly["methods"]]))
    return np.array(out)


def _interval(values: np.ndarray) -> dict:
    # rounded: means of equal ratios over layers differ in the last bits (0.3 vs
    # 0.30000000000000004), which the bootstrap-t would read as a tiny spread and blow up
    values = np.round(values[np.isfinite(values)], 12)
    if len(values) == 0:
        return {"mean": float("nan"), "ci": [float("nan"), float("nan")], "n": 0}
    mean, low, high, _ = bootstrap.studentized(values)
    return {"mean": float(mean), "ci": [float(low), float(high)], "n": int(len(values)),
            "flagged": bool(bootstrap.outside_validity(len(values), bootstrap.sample_skewness(values)))}


def _getter(score: str, k: str | None = None):
    return (lambda m: m[score]) if k is None else (lambda m: m[score][k])


def summarise(records: list[dict], header: dict) -> dict:
    """The JSON summary of the records (the CLI's ``--json``)."""
    if not records:
        raise ValueError("no input was measured")
    methods = list(records[0]["layers"][0]["methods"])
    ks = list(records[0]["layers"][0]["methods"][methods[0]]["topk_recall"])
    all_layers = sorted({ly["layer"] for r in records for ly in r["layers"]})
    thirds = np.array_split(np.array(all_layers), 3)
    out: dict[str, Any] = {**header, "n_inputs": len(records),
                           "n_edges": int(sum(r["n_edges"] for r in records)), "methods": {}}
    for m in methods:
        entry: dict[str, Any] = {}
        for score in SCORES:
            iv = _interval(_per_input(records, m, _getter(score)))
            entry[score], entry[f"{score}_ci"] = iv["mean"], iv["ci"]
            entry[f"{score}_flagged"] = iv.get("flagged", False)
        entry["ci"] = entry["spearman_abs_ci"]
        for score in ("topk_recall", "captured"):
            entry[score] = {}
            for k in ks:
                iv = _interval(_per_input(records, m, _getter(score, k)))
                entry[score][k] = iv["mean"]
                entry.setdefault(f"{score}_ci", {})[k] = iv["ci"]
        entry["by_depth"] = {}
        for name, third in zip(("early", "middle", "late"), thirds, strict=True):
            layer_set = set(third.tolist())
            iv = _interval(_per_input(records, m, _getter("spearman_abs"), layer_set.__contains__))
            entry["by_depth"][name] = {"layers": [int(third[0]), int(third[-1])] if len(third) else [],
                                       "spearman_abs": iv["mean"], "ci": iv["ci"]}
        entry["kinds"] = {k: _nanmean([_nanmean([ly["methods"][m]["kinds"][k] for ly in r["layers"]])
                                       for r in records]) for k in KINDS}
        entry["curve"] = [_nanmean([_nanmean([ly["methods"][m]["curve"][i] for ly in r["layers"]
                                              if _defined(ly["methods"][m])])
                                    for r in records]) for i in range(K_CURVE)]
        out["methods"][m] = entry
    out["kinds_truth"] = {k: _nanmean([_nanmean([ly["kinds_truth"][k] for ly in r["layers"]]) for r in records])
                          for k in KINDS}
    out["joint_removal"] = _joint(records, ks)
    out["paired"] = _paired(records, methods, ks)
    return out


def _joint(records: list[dict], ks: list[str]) -> dict:
    names = sorted({n for r in records for ly in r["layers"] for n in ly.get("joint", {})})
    out: dict[str, Any] = {}
    for name in names:
        out[name] = {}
        for k in ks:
            drops = _joint_per_input(records, name, k)
            adds = np.array([_nanmean([ly["joint"][name][k]["additive"] for ly in r["layers"] if name in ly.get("joint", {})])
                             for r in records])
            iv = _interval(drops)
            out[name][k] = {"drop": iv["mean"], "ci": iv["ci"], "additive": _nanmean(adds.tolist())}
    return out


def _defined(score: dict) -> bool:
    """Whether a method had weights on this layer (records stored before the curve's own
    NaN check carry a curve for an undefined method: its captured cells say NaN)."""
    return not math.isnan(score["captured"]["1"])


def _joint_per_input(records: list[dict], method: str, k: str) -> np.ndarray:
    return np.array([_nanmean([ly["joint"][method][k]["drop"] for ly in r["layers"]
                               if method in ly.get("joint", {})]) for r in records])


def _paired(records: list[dict], methods: list[str], ks: list[str]) -> dict:
    family: dict[str, bootstrap.PairedDifference] = {}
    k_mid = ks[len(ks) // 2]
    measures = {"spearman_abs": _getter("spearman_abs"), "spearman_signed": _getter("spearman_signed"),
                f"captured@{k_mid}": _getter("captured", k_mid)}
    for a, b in PAIRS:
        if a not in methods or b not in methods:
            continue
        for mname, get in measures.items():
            va, vb = _per_input(records, a, get), _per_input(records, b, get)
            ok = np.isfinite(va) & np.isfinite(vb)
            if ok.sum() >= bootstrap.MIN_N:
                family[f"{b} - {a}: {mname}"] = bootstrap.paired_bootstrap(va[ok], vb[ok])
        # the paper's protocol at one query: the drop when each method's top k go together
        va, vb = _joint_per_input(records, a, k_mid), _joint_per_input(records, b, k_mid)
        ok = np.isfinite(va) & np.isfinite(vb)
        if ok.sum() >= bootstrap.MIN_N:
            family[f"{b} - {a}: joint drop@{k_mid}"] = bootstrap.paired_bootstrap(va[ok], vb[ok])
    resolved = bootstrap.holm(family)
    return {key: {"mean": d.mean, "ci": [d.low, d.high], "p": d.p, "n": d.n,
                  "resolved": bool(d.resolved), "flagged": d.flagged}
            for key, d in resolved.items()}
