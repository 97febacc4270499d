"""Compile the shipped ground-truth programs (cwlens/groundtruth/programs/<name>.py) with
tracr and write, beside each source, the files ``cwlens.groundtruth.load`` reads:

- ``<name>.json``: the layout (token ids, output values, residual directions), the
  placements (which head / MLP computes which operation), the components, the inputs
  ``sample_inputs(256, seed=0)`` with the program's outputs and tracr's decoded outputs;
- ``<name>.npz``: the converted weights (``w.*``), the truth of those inputs (``truth.*``,
  bit-packed) and tracr's own residual stream on the first 16 of them (``check.*``), which
  the tests compare the converted model against without jax.

Before writing, the converted model is checked against tracr on all 256 inputs: every
residual within 1e-5, the decoded outputs equal. Needs the tracr extra:

    pip install "cwlens[tracr]"      # or: pip install tracr-pypi==1.0.0
    python scripts/compile_groundtruth.py [--program NAME]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cwlens.groundtruth import library  # noqa: E402
from cwlens.groundtruth.codec import decode, encode, written  # noqa: E402
from cwlens.groundtruth.convert import weights_of  # noqa: E402
from cwlens.groundtruth.truth import pack  # noqa: E402

N_INPUTS, SEED, N_CHECKED, TOLERANCE = 256, 0, 16, 1e-5


def residuals_of(model, tokens) -> np.ndarray:
    """The converted model's residual after every attention and MLP block: ``[2L, n, d]``."""
    _, cache = model.run_with_cache(encode(model, tokens))
    names = [f"blocks.{layer}.hook_resid_{where}" for layer in range(model.cfg.n_layers)
             for where in ("mid", "post")]
    return np.stack([cache[n][0].double().numpy() for n in names])


def same_outputs(ours: list, theirs: list, written: list) -> bool:
    """Equal where the program wrote a value (:func:`cwlens.groundtruth.codec.written`)."""
    if len(ours) != len(theirs):
        return False
    for a, b, w in zip(ours, theirs, written, strict=True):
        if not w:
            continue
        if isinstance(a, float) or isinstance(b, float):
            if abs(float(a) - float(b)) > TOLERANCE:
                return False
        elif a != b:
            return False
    return True


def tracr_written(model, residuals: np.ndarray) -> list[bool]:
    """Where tracr's output (its last residual, unembedded) holds a value."""
    logits = torch.from_numpy(residuals[-1]).double() @ model.W_U.double()
    return written(model, logits).tolist()


def compile_one(name: str, folder: Path) -> None:
    start = time.time()
    source = (folder / f"{name}.py").read_text()
    program = library.from_definitions(library.read_file(folder / f"{name}.py"), name, source)
    assembled = program._cache["assembled"]
    model = program.model
    inputs = program.sample_inputs(N_INPUTS, SEED)
    from cwlens.groundtruth.compiler import tracr_reference

    reference = tracr_reference(assembled, inputs)
    worst, written_by_tracr = 0.0, []
    for tokens, (theirs, decoded) in zip(inputs, reference, strict=True):
        ours = residuals_of(model, tokens)
        worst = max(worst, float(np.abs(ours - theirs).max()))
        logits = model(encode(model, tokens))
        got, mask = decode(model, logits), tracr_written(model, theirs)
        written_by_tracr.append(mask)
        if written(model, logits)[0].tolist() != mask or not same_outputs(got, decoded, mask):
            raise SystemExit(f"{name}: decoded {got} but tracr decoded {decoded} on {tokens} "
                             f"(written: {mask})")
    if worst > TOLERANCE:
        raise SystemExit(f"{name}: a residual differs from tracr's by {worst:.2e} > {TOLERANCE}")
    truths = program.truth(inputs)
    arrays = {f"w.{k}": v for k, v in weights_of(model).items()}
    arrays.update({f"truth.{k}": v for k, v in pack(truths).items()})
    for i, (residuals, _) in enumerate(reference[:N_CHECKED]):
        arrays[f"check.{i}"] = residuals.astype(np.float32)
    meta = {
        "format": library.FORMAT, "name": name, "description": program.description,
        "vocab": list(program.vocab), "max_seq_len": program.max_seq_len, "bos": program.bos,
        "sampling": program.sampling, "layout": model.layout.to_json(),
        "components": sorted(list(c) for c in program.components),
        "placements": [p.to_json() for p in program.placements],
        "tracr": "tracr-pypi==1.0.0", "n_checked": N_CHECKED, "check_tolerance": TOLERANCE,
        "inputs": inputs, "outputs": [t.output for t in truths],
        "tracr_decoded": [decoded for _, decoded in reference], "tracr_written": written_by_tracr,
    }
    np.savez_compressed(folder / f"{name}.npz", **arrays)
    (folder / f"{name}.json").write_text(json.dumps(meta) + "\n")
    print(f"{name}: {model.cfg.n_layers} layers x {model.cfg.n_heads} heads, d_model "
          f"{model.cfg.d_model}; {len(inputs)} inputs equal tracr's (worst residual "
          f"difference {worst:.1e}); {time.time() - start:.0f} s")


def table() -> str:
    """A markdown table of the shipped programs and their truth (no tracr needed): the
    numbers of docs/groundtruth.md, "The ground truth"."""
    from cwlens.groundtruth.truth import reach

    rows = ["| program | layers x heads | d_model | components | Aggregate rows that fall back "
            "to the BOS | dependence pairs (a) | of them reached by (b) | pairs (b) connects "
            "(q != k) without (a) |", "|---|---|---|---|---|---|---|---|"]
    for name in library.names():
        program = library.load(name)
        cfg = program.model.cfg
        truths = program.truth(program.sample_inputs(N_INPUTS, SEED))
        aggregate_heads = [(p.layer, p.head) for p in program.placements if p.kind == "aggregate"]
        rows_total = sum(len(t.tokens) - 1 for t in truths) * len(aggregate_heads)
        fallen = sum(int(t.fallback[ly, h].sum()) for t in truths for ly, h in aggregate_heads)
        dep = reached = paths = lone = 0
        for t in truths:
            r = reach(t.movement)[1:, 1:]
            a = t.dependence[1:, 1:]
            moved = r & ~torch.eye(len(r), dtype=torch.bool)  # a position's own: no movement
            dep += int(a.sum())
            reached += int((a & r).sum())
            paths += int(moved.sum())
            lone += int((moved & ~a).sum())
        share = "-" if not rows_total else f"{fallen / rows_total:.0%}"
        comps = ", ".join(f"L{c[1]}H{c[2]}" if c[0] == "attn" else f"L{c[1]} MLP"
                          for c in sorted(program.components, key=lambda c: (c[1], c[0] != "attn")))
        rows.append(f"| {name} | {cfg.n_layers} x {cfg.n_heads} | {cfg.d_model} | {comps} | {share} | "
                    f"{dep} | {reached / max(dep, 1):.0%} | {lone / max(paths, 1):.0%} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", action="append",
                        help="a program's name (repeatable; default: every programs/*.py)")
    parser.add_argument("--table", action="store_true",
                        help="print the shipped programs' table (docs/groundtruth.md; no tracr needed)")
    args = parser.parse_args(argv)
    if args.table:
        print(table())
        return
    folder = library.PROGRAMS
    available = sorted(p.stem for p in folder.glob("*.py"))
    for name in args.program or available:
        if name not in available:
            raise SystemExit(f"no program {name!r} in {folder}: the programs are {available}")
        compile_one(name, folder)


if __name__ == "__main__":
    main()
