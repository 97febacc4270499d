"""``cwlens groundtruth --edges``: every method scored against the exact effect of removing
each attention edge at one query (:mod:`cwlens.groundtruth.edge_study`)."""

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cwlens.cli import arg_types
from cwlens.cli.common import DEFAULT_MODEL, figures_dir, load_handle
from cwlens.datasets import ChoiceItem, TextSample, load_dataset
from cwlens.errors import InvalidArgumentError
from cwlens.faithfulness.encoder import sentences
from cwlens.faithfulness.report import check_block, write_block
from cwlens.groundtruth import edge_report, library
from cwlens.groundtruth.edge_methods import EDGE_METHODS, LABELS
from cwlens.groundtruth.edge_programs import program_records
from cwlens.groundtruth.edge_study import EdgeInput, EdgeSettings, run_edges, summarise
from cwlens.groundtruth.edges import OBJECTIVES
from cwlens.runs import distributed

EDGE_EPILOG = """\
per-edge truth (--edges): remove one edge a_ij v~_j of head h at the query, run the rest of
the model, and take objective(clean) - objective(ablated); score every method's weights
against it per layer (Spearman of magnitudes and of signed values, top-k recall, the
captured share of the top-k true |effect|) and remove each method's top k edges together.
  cwlens groundtruth --edges --model smollm2-135m --data gsm8k --samples 100 --max-tokens 64 --json out.json
  cwlens groundtruth --edges --data ioi --objective logit_diff --samples 50
  cwlens groundtruth --edges --text "When Mary and John went to the store, John gave a drink to"
--json FILE holds {"model", "data", "objective", "n_inputs", "n_edges", "methods": {name:
{"spearman_abs", "ci", "spearman_signed", "topk_recall": {"1", "5", "10"}, "captured": {...},
"by_depth", "kinds", "curve"}}, "joint_removal", "kinds_truth", "paired"}.
"""

TEXT_DATA = ("gsm8k", "fineweb_edu")
CHOICE_DATA = ("ioi", "induction")
TRACR_DATA = ("tracr",)


def add_edge_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("per-edge truth (--edges)")
    g.add_argument("--edges", action="store_true",
                   help="score the methods against the exact effect of removing each attention edge "
                   "of a real model (instead of the compiled programs)")
    g.add_argument("--model", default=DEFAULT_MODEL, help="with --edges: the model (default: %(default)s)")
    g.add_argument("--device", default=None, type=arg_types.device, help="with --edges: cpu, cuda, ...")
    g.add_argument("--data", default="gsm8k", choices=TEXT_DATA + CHOICE_DATA + TRACR_DATA,
                   help="with --edges: the inputs (default: %(default)s; tracr: the compiled programs "
                   "of --program, --samples inputs each, objective: the decoded output's logit)")
    g.add_argument("--text", action="append", default=None,
                   help="with --edges: a text of your own (repeat for several; replaces --data)")
    g.add_argument("--samples", type=arg_types.positive_int, default=100,
                   help="with --edges: inputs (default: %(default)s)")
    g.add_argument("--max-tokens", type=arg_types.max_tokens, default=64,
                   help="with --edges: a text is cut to this many tokens (default: %(default)s)")
    g.add_argument("--objective", default="logprob", choices=OBJECTIVES,
                   help="with --edges: logprob of the clean top-1 (default; of the gold answer on "
                   "ioi/induction), logit_diff (ioi/induction: gold minus foil), kl, nll, "
                   "embedding (encoders: 1 - cos of the sentence embedding; --data gsm8k/fineweb_edu "
                   "then gives whole sentences)")
    g.add_argument("--layers", type=arg_types.layers_or_all, default=None,
                   help="with --edges: layers, e.g. 0,5,10 (default: all)")
    g.add_argument("--query", type=int, default=-1,
                   help="with --edges: the query position (default: -1, the last)")
    g.add_argument("--dtype", default="float64", choices=("float32", "float64"),
                   help="with --edges: the dtype the model runs in (default: %(default)s, exact)")
    g.add_argument("--methods", default=",".join(EDGE_METHODS),
                   type=arg_types.choice_list(EDGE_METHODS, "method"),
                   help="with --edges: methods, comma-separated (default: all)")
    g.add_argument("--no-resume", action="store_true",
                   help="with --edges: start afresh instead of resuming the run in --out")


def _items(args, handle) -> list:
    keep = args.max_tokens + (1 if args.objective == "nll" else 0)
    rows: list[tuple[str, str, Any]] = []
    if args.objective == "embedding" and not handle.is_encoder:
        raise InvalidArgumentError("--objective embedding reads an encoder's sentence embedding; "
                                   f"{args.model} is a decoder: use logprob, kl or nll")
    if handle.is_encoder and args.objective != "embedding":
        print(f"note: an encoder's logits come from its masked-LM head; {args.model} may have none "
              "(all-minilm-l6-v2: a head nobody trained): --objective embedding reads the "
              "sentence embedding", file=sys.stderr)
    if args.text:
        rows = [(f"text-{i}", t, None) for i, t in enumerate(args.text)]
    elif args.data in TEXT_DATA and handle.is_encoder:  # whole sentences, as the encoder task
        rows = [(i.replace("/", "-s"), t, None) for i, t in sentences(args.data, args.samples)]  # a file name
    elif args.data in TEXT_DATA:
        rows = [(s.id, s.text, None) for s in load_dataset(args.data, args.samples)
                if isinstance(s, TextSample)]
    else:
        for item in load_dataset(args.data, args.samples):
            if not isinstance(item, ChoiceItem):
                continue
            gold = item.continuations[item.gold]
            foil = item.continuations[1 - item.gold if item.gold < 2 else 0]
            first = [int(handle.to_tokens(c, prepend_bos=False)[0, 0]) for c in (gold, foil)]
            target = tuple(first) if args.objective == "logit_diff" else (
                None if args.objective == "kl" else first[0])
            if args.objective == "nll":
                raise InvalidArgumentError("--objective nll reads a text's own next token: use it "
                                           "with gsm8k, fineweb_edu or --text")
            rows.append((item.id, item.contexts[item.gold], target))
    if args.objective == "logit_diff" and (args.text or args.data in TEXT_DATA):
        raise InvalidArgumentError("--objective logit_diff needs two answers: use --data ioi or "
                                   "induction (gold minus foil)")
    items = []
    for item_id, text, target in rows:
        tokens = handle.to_tokens(text)[0]
        cut = tokens[:keep] if (args.text or args.data in TEXT_DATA) and not handle.is_encoder else tokens
        if cut.numel() < 2:
            raise InvalidArgumentError(f"input {item_id} has {cut.numel()} token(s): an edge needs a "
                                       "query and a key")
        query = -2 if (args.objective == "nll" and args.query == -1) else args.query  # a next token
        items.append(EdgeInput(item_id, cut.to(torch.long), query, target))
    return items


def run(args) -> int:

    # --out's default is the compiled programs' folder: the edges get a folder of their own
    given = "runs/groundtruth_edges" if args.out == "runs/groundtruth" else args.out
    out = arg_types.output_dir(given)
    json_path = arg_types.output_file(args.json, "--json", "edges.json") if args.json else None
    figures = figures_dir(args, given)
    figures_out = arg_types.output_dir(figures, "--figures") if figures else None
    md = [arg_types.markdown_file(p, "--summary-md") for p in (args.summary_md or "").split(",") if p]
    model_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(args.model.rstrip("/")).name)  # a hub id or folder
    key = ("tracr" if args.data == "tracr" and not args.text
           else f"{model_name}-{'text' if args.text else args.data}-{args.objective}")
    start, end = edge_report.START.format(key=key), edge_report.END.format(key=key)
    for path in md:
        check_block(path, start, end)
    if args.data == "tracr" and not args.text:
        return _run_programs(args, out, json_path, md, start, end)
    with distributed.session() as world:  # torchrun: the inputs are dealt over the ranks
        main = world is None or world.main
        return _run_model(args, out, json_path, figures_out, md, (start, end, key), main)


def _run_model(args, out, json_path, figures_out, md, block, main: bool) -> int:
    start, end, key = block
    handle = load_handle(args)
    items = _items(args, handle)
    data = "text" if args.text else args.data
    config = {"model": args.model, "data": data, "objective": args.objective, "dtype": args.dtype,
              "max_tokens": args.max_tokens, "query": args.query, "methods": list(args.methods),
              "layers": None if args.layers is None else list(args.layers)}
    if main:
        print(f"cwlens groundtruth --edges: {args.model}, {len(items)} inputs of {data}, objective "
              f"{args.objective}, {args.dtype}", flush=True)
    t0 = time.perf_counter()
    settings = EdgeSettings(args.objective, None if args.layers is None else list(args.layers),
                            getattr(torch, args.dtype), tuple(args.methods))
    records = run_edges(handle, items, out, config, resume=not args.no_resume,
                        progress=not args.no_progress, settings=settings)
    header = {k: config[k] for k in ("model", "data", "objective", "dtype", "max_tokens", "query")}
    if not (args.text or args.data in TEXT_DATA) or handle.is_encoder:
        header["max_tokens"] = None  # a prompt, or an encoder's sentence, is not cut
    header["wall_s_this_run"] = round(time.perf_counter() - t0, 1)
    header["command"] = edge_report.command_line(args)
    if not main:  # rank 0 writes
        return 0
    summary = summarise(records, header)
    text = edge_report.markdown(summary)
    print()
    print(text)
    written = [out / "summary.json", out / "tables.md"]
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "tables.md").write_text(text)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(summary, indent=1))
        written.append(Path(json_path))
    if figures_out is not None:
        from cwlens.plotting.edges import captured_figure  # heavy (plotly)
        from cwlens.plotting.export import save_figure

        written += save_figure(captured_figure([summary], LABELS), figures_out / f"edges_captured_{key}",
                               png=not args.no_png)
    for path in md:
        write_block(path, text, start, end)
        written.append(Path(path))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _run_programs(args, out, json_path, md, start, end) -> int:
    """``--data tracr``: every chosen compiled program, its own sampled inputs, the last
    position's decoded output logit (:mod:`cwlens.groundtruth.edge_programs`)."""
    chosen = args.program or library.names()
    programs = ([library.from_file(chosen[0])] if len(chosen) == 1 and chosen[0].endswith(".py")
                else [library.load(name) for name in chosen])
    summaries, texts = {}, []
    t0 = time.perf_counter()
    for program in programs:
        print(f"cwlens groundtruth --edges: {program.name}, {args.samples} inputs, objective: the "
              "decoded output's logit at the last position", flush=True)
        records = program_records(program, args.samples, methods=args.methods)
        header = {"model": program.name, "data": "tracr", "objective": "logit", "dtype": "float64",
                  "max_tokens": None, "query": -1,
                  "command": f"cwlens groundtruth --edges --data tracr --program {program.name} "
                             f"--samples {args.samples}"}
        summaries[program.name] = summary = summarise(records, header)
        texts.append(edge_report.markdown(summary))
    text = "\n".join(texts)
    print(text)
    result = {"data": "tracr", "wall_s_this_run": round(time.perf_counter() - t0, 1), "programs": summaries}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    (out / "tables.md").write_text(text)
    written = [out / "summary.json", out / "tables.md"]
    if json_path is not None:
        Path(json_path).write_text(json.dumps(result, indent=1))
        written.append(Path(json_path))
    for path in md:
        write_block(path, text, start, end)
        written.append(Path(path))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
