"""Where cwlens' bootstrap-t intervals and Holm's correction hold: coverage and family-wise
error by sample size n and skewness, on simulated null samples (issue 39, point 7).

    OMP_NUM_THREADS=1 python scripts/bootstrap_validity.py
    # about 2 minutes of CPU on one core; writes results/bootstrap_validity.json and the
    # generated block of docs/statistics.md

Per population (:data:`cwlens.core.bootstrap_validity.POPULATIONS`: mean 0, skewness 0 to
6.2) and n: ``--families`` families of 30 null samples, each tested as
:func:`cwlens.core.bootstrap.paired_bootstrap` tests a paired difference (B = 2000
resamples, seed 0, as the tables). Reported: the coverage of the 95% interval, Holm's
family-wise error at 5% over families of 4 and of 30 tests, and the same for the BCa
interval and a sign-flip test measured on the same samples. A (population, n) cell
*holds* when coverage >= 0.94 and both family-wise errors are at most 0.05 plus two
Monte Carlo standard errors; the validity range is, per n, the largest skewness below
which every cell holds at that n and every larger n. Last, the flag of the tables
(:func:`cwlens.core.bootstrap.outside_validity`: the *sample* skewness against that range)
is applied to the same samples: how often it fires, and the coverage and family-wise
error of what it lets through.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from cwlens.core import bootstrap_validity as bv
from cwlens.core.bootstrap import VALID_SKEWNESS, outside_validity

N_GRID = (8, 16, 24, 50, 100, 200, 500)
SIZES = (4, 30)
MIN_COVERAGE, ALPHA = 0.94, 0.05
CANDIDATES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)  # flag bounds tried
COMMAND = "OMP_NUM_THREADS=1 python scripts/bootstrap_validity.py"
START, END = "<!-- bootstrap-validity:start -->", "<!-- bootstrap-validity:end -->"


def fwer_bound(families: int, size: int, m: int = 30) -> float:
    """0.05 plus two Monte Carlo standard errors of a family-wise error of 0.05 estimated
    from ``families * (m // size)`` families."""
    count = families * (m // size)
    return ALPHA + 2 * np.sqrt(ALPHA * (1 - ALPHA) / count)


def summarise(pop: bv.Population, n: int, r: bv.CellResult) -> dict:
    """The cell's numbers without the flag: the bootstrap-t, BCa and sign-flip."""
    out = {"population": pop.name, "skewness": round(pop.skewness, 3), "n": n,
           "coverage": float(r.covered.mean()), "type1": float((r.p < ALPHA).mean())}
    for size in SIZES:
        out[f"fwer{size}"] = bv.family_error(r.p, size)
        out[f"bca_fwer{size}"] = bv.family_error(r.p_bca, size)
        out[f"signflip_fwer{size}"] = bv.family_error(r.p_signflip, size)
    out["bca_coverage"] = float((r.p_bca >= ALPHA).mean())
    out["signflip_type1"] = float((r.p_signflip < ALPHA).mean())
    return out


def with_flag(n: int, r: bv.CellResult, rule) -> dict:
    """What a table shows under the flag ``rule``: the share of samples flagged, the
    coverage of the unflagged claims (a flagged interval claims nothing: 1 - P(unflagged
    and missing 0)), and Holm's family-wise error counting unflagged tests only."""
    ok = ~outside_validity(n, r.skewness, rule)
    out = {"flagged": float(1 - ok.mean()), "claims_coverage": float(1 - (ok & ~r.covered).mean())}
    for size in SIZES:
        out[f"fwer{size}_unflagged"] = bv.family_error(r.p, size, counted=ok)
    return out


def holds(cell: dict, families: int, prefix: str = "coverage", suffix: str = "") -> bool:
    return cell[prefix] >= MIN_COVERAGE and all(
        cell[f"fwer{s}{suffix}"] <= fwer_bound(families, s) for s in SIZES)


def monotone(local: dict[int, float]) -> tuple[tuple[int, float], ...]:
    """Per n, the smallest bound at this n or any larger one (a range that only widens
    with n: a sample between two sizes of the grid gets the smaller one's bound)."""
    return tuple((n, min(local[m] for m in N_GRID if m >= n)) for n in N_GRID)


def validity_range(cells: list[dict], families: int) -> tuple[tuple[int, float], ...]:
    """``((n, largest skewness), ...)``: per n of the grid, the largest population
    skewness such that every population up to it holds at this n (-1: none)."""
    local = {}
    for n in N_GRID:
        here = sorted((c for c in cells if c["n"] == n), key=lambda c: c["skewness"])
        local[n] = -1.0
        for c in here:
            if not holds(c, families):
                break
            local[n] = c["skewness"]
    return monotone(local)


def flag_rule(raw: dict, population_range, families: int) -> tuple[tuple[int, float], ...]:
    """Per n, the largest bound on the *sample* skewness (of :data:`CANDIDATES`, at most
    the population range's) under which every population of the grid keeps the
    unflagged claims' coverage >= 0.94 and Holm's error over unflagged tests within its
    bound: a sample's skewness understates its population's, most at small n."""
    local = {}
    for n, bound in population_range:
        local[n] = -1.0
        for c in (c for c in CANDIDATES if c <= bound):
            cells = [with_flag(n, r, ((n, c),)) for (_, size), (_, r) in raw.items() if size == n]
            if all(holds(cell, families, "claims_coverage", "_unflagged") for cell in cells):
                local[n] = c
    return monotone(local)


def fmt(x: float, digits: int = 3) -> str:
    return "—" if x != x else f"{x:.{digits}f}"


def markdown(data: dict) -> str:
    fam = data["families"]
    cells = data["cells"]
    rule = ", ".join(_bound(n, g) for n, g in data["valid_skewness"])
    lines = [f"Written by `{COMMAND}` ({fam} families of 30 null samples per cell, "
             f"B = {data['n_boot']} resamples, {_timing(data)}). "
             f"**bold**: the cell misses coverage ≥ {MIN_COVERAGE} or a family-wise error ≤ "
             f"0.05 + 2 Monte Carlo s.e. ({fmt(fwer_bound(fam, 4))} for 4 tests, "
             f"{fmt(fwer_bound(fam, 30))} for 30).", ""]
    for title, keys in (("Bootstrap-t (what the tables use): coverage of the 95% interval / "
                         "Holm's family-wise error over 4 / over 30 null tests",
                         ("coverage", "fwer4", "fwer30")),
                        ("BCa (inverted to a test), same samples and resamples: coverage / "
                         "family-wise error over 4 / 30", ("bca_coverage", "bca_fwer4", "bca_fwer30")),
                        ("Sign-flip permutation test, same samples: 1 − type-I error at 5% / "
                         "family-wise error over 4 / 30", ("signflip_type1", "signflip_fwer4",
                                                          "signflip_fwer30"))):
        lines += [f"**{title}**", "", "| population (skewness) | " + " | ".join(
            f"n = {n}" for n in N_GRID) + " |", "|---|" + "---|" * len(N_GRID)]
        for pop in dict.fromkeys(c["population"] for c in cells):
            row = [f"{pop} ({next(c['skewness'] for c in cells if c['population'] == pop):.2f})"]
            for n in N_GRID:
                c = next(c for c in cells if c["population"] == pop and c["n"] == n)
                cov = 1 - c[keys[0]] if keys[0] == "signflip_type1" else c[keys[0]]
                bad = cov < MIN_COVERAGE or any(c[k] > fwer_bound(fam, s)
                                                for k, s in zip(keys[1:], SIZES, strict=True))
                text = " / ".join([fmt(cov), *(fmt(c[k]) for k in keys[1:])])
                row.append(f"**{text}**" if bad else text)
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    pop_range = ", ".join(_bound(n, g) for n, g in data["population_range"])
    lines += [f"**Where the bootstrap-t holds** (every population up to this skewness holds at "
              f"this n and every larger one): {pop_range}.", "",
              f"**The flag** (`cwlens.core.bootstrap.VALID_SKEWNESS`): a cell is flagged when "
              f"the sample skewness of its values exceeds the bound at its n ({rule}; below "
              f"n = {N_GRID[0]}: always). The bound is on the *sample* "
              "skewness, which understates its population's (most at small n), so it is the "
              "largest bound under which, on every population of the grid, the table's unflagged "
              "claims keep their coverage and Holm's error (below): share flagged / coverage of "
              "the unflagged claims (1 − share unflagged and missing 0) / family-wise error over "
              "4 / over 30, counting unflagged tests only.", "",
              "| population (skewness) | " + " | ".join(f"n = {n}" for n in N_GRID) + " |",
              "|---|" + "---|" * len(N_GRID)]
    for pop in dict.fromkeys(c["population"] for c in cells):
        row = [f"{pop} ({next(c['skewness'] for c in cells if c['population'] == pop):.2f})"]
        for n in N_GRID:
            c = next(c for c in cells if c["population"] == pop and c["n"] == n)
            text = (f"{fmt(c['flagged'], 2)} / {fmt(c['claims_coverage'])} / "
                    f"{fmt(c['fwer4_unflagged'])} / {fmt(c['fwer30_unflagged'])}")
            row.append(text if holds(c, fam, "claims_coverage", "_unflagged") else f"**{text}**")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _timing(data: dict) -> str:
    cpu = data.get("cpu_seconds")
    wall = f"{data['seconds']:.0f} s wall time"
    return f"{cpu:.0f} s of CPU on one thread, {wall}" if cpu is not None else f"{wall} on one thread"


def _bound(n: int, g: float) -> str:
    return f"n ≥ {n}: |skewness| ≤ {g:g}" if g >= 0 else f"n ≥ {n}: none"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", type=int, default=600, help="families of 30 null tests per cell")
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--json", default="results/bootstrap_validity.json")
    ap.add_argument("--md", default="docs/statistics.md",
                    help="the page whose generated block is replaced ('' for none)")
    ap.add_argument("--report-only", action="store_true",
                    help="no simulation: rewrite the page's block from --json")
    args = ap.parse_args(argv)
    if args.report_only:
        return report(json.loads(Path(args.json).read_text(encoding="utf-8")), args.md)
    t0, c0 = time.perf_counter(), time.process_time()
    raw = {}
    for pop in bv.POPULATIONS:
        for n in N_GRID:
            raw[(pop.name, n)] = (pop, bv.simulate(pop, n, args.families, n_boot=args.n_boot))
            print(f"{pop.name:20s} n = {n:4d}: coverage {raw[(pop.name, n)][1].covered.mean():.3f}"
                  f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    cells = [summarise(pop, n, r) for (_, n), (pop, r) in raw.items()]
    population_range = validity_range(cells, args.families)
    rule = flag_rule(raw, population_range, args.families)
    for cell, (_, r) in zip(cells, raw.values(), strict=True):
        cell.update(with_flag(cell["n"], r, rule))
    data = {"command": COMMAND, "families": args.families, "tests_per_family": 30,
            "n_boot": args.n_boot, "level": 0.95, "criteria": {
                "coverage_at_least": MIN_COVERAGE,
                **{f"fwer{s}_at_most": fwer_bound(args.families, s) for s in SIZES}},
            "population_range": [list(v) for v in population_range],
            "valid_skewness": [list(v) for v in rule], "cells": cells,
            "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return report(data, args.md)


def report(data: dict, md: str) -> int:
    """Print the tables, write them into ``md`` (unless empty), and say whether the
    measured rule is the one cwlens uses."""
    text = markdown(data)
    print(text)
    if md:
        from cwlens.faithfulness.report import write_block

        write_block(md, text, START, END)
    rule = tuple((int(n), float(g)) for n, g in data["valid_skewness"])
    if rule != tuple(VALID_SKEWNESS):
        print(f"note: the measured rule {rule} differs from cwlens.core.bootstrap."
              f"VALID_SKEWNESS {VALID_SKEWNESS}: update the constant", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
