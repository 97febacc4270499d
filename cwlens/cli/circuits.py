"""``cwlens circuits``: head rankings by contribution, attention, direct logit attribution
and activation patching on a templated task, their agreement, and the token-flow graph."""

from cwlens import circuits
from cwlens.cli import arg_types
from cwlens.cli.common import (
    add_figures_flag,
    add_model_args,
    add_progress_flag,
    figures_dir,
    load_handle,
)
from cwlens.errors import InvalidArgumentError
from cwlens.runs.progress import bar, status


def register(sub) -> None:
    p = sub.add_parser(
        "circuits",
        help="head scores vs activation patching on IOI / induction / capitals, and the token flow",
        description="Builds the task offline from templates, scores every head at the task's "
        "query positions (share of the layer output, contribution and attention on the task's "
        "key, direct logit attribution), patches every head's hook_z from the corrupted "
        "prompts, prints the rankings and their Spearman correlation and top-k overlap with "
        "patching, and draws the agreement scatter and the token-flow graph of the first "
        "prompt (HTML + PNG).",
    )
    add_model_args(p)
    p.add_argument("--task", default="ioi", choices=("ioi", "induction", "capitals"),
                   help="the task (default: %(default)s)")
    p.add_argument("--prompts", type=arg_types.positive_int, default=None,
                   help="prompts in the batch (default: 8 for ioi, 4 for induction; capitals uses its list)")
    p.add_argument("--length", type=arg_types.positive_int, default=None,
                   help="induction: random tokens per copy (default: 20)")
    p.add_argument("--top", type=arg_types.positive_int, default=10, help="heads listed per score (default: %(default)s)")
    p.add_argument("--k", type=arg_types.positive_int, default=10, help="k of the top-k overlap (default: %(default)s)")
    p.add_argument("--mode", default="corrupt", choices=("corrupt", "mean"),
                   help="patch from the corrupted prompts or mean-ablate (default: %(default)s)")
    p.add_argument("--rule", default="projection", choices=("projection", "signed", "absolute"),
                   help="token-flow share rule (default: %(default)s; see docs/circuits.md)")
    p.add_argument("--ioi-corruption", default=None, choices=("abc", "swap"),
                   help="ioi: corrupted prompts with three random names (Wang et al.'s ABC, "
                        "default) or the second subject swapped for the indirect object")
    p.add_argument("--threshold", type=arg_types.non_negative_float, default=0.02,
                   help="token-flow edges kept: |weight| >= this (default: %(default)s)")
    p.add_argument("--seed", type=arg_types.non_negative_int, default=0, help="seed of the templates / random tokens")
    p.add_argument("--out", default="runs/circuits", help="folder for CSV tables (default: %(default)s)")
    add_figures_flag(p)
    p.add_argument("--no-png", action="store_true", help="write HTML only (no Chromium needed)")
    add_progress_flag(p)
    p.set_defaults(func=run)


MAX_PROMPTS = 1024  # one batch: its activations are held at once


def _task_kwargs(args) -> dict:
    if args.length is not None and args.task != "induction":
        raise InvalidArgumentError(f"--length applies to --task induction only (this is "
                                   f"--task {args.task}); drop it")
    if args.ioi_corruption is not None and args.task != "ioi":
        raise InvalidArgumentError(f"--ioi-corruption applies to --task ioi only (this is "
                                   f"--task {args.task}); drop it")
    if args.prompts is not None and args.prompts > MAX_PROMPTS:
        raise InvalidArgumentError(
            f"--prompts {args.prompts}: the prompts run as one batch, patched once per head, so "
            f"memory grows with their number; at most {MAX_PROMPTS}. For more, run several "
            "--seed values and pool the tables")
    if args.task == "ioi":
        return {"n_prompts": args.prompts or 8, "seed": args.seed,
                "corruption": args.ioi_corruption or "abc"}
    if args.task == "induction":
        return {"n_prompts": args.prompts or 4, "length": args.length or 20, "seed": args.seed}
    if args.prompts is not None:
        raise InvalidArgumentError("--prompts does not apply to --task capitals (it uses its "
                                   "list of countries); drop it")
    return {}


def run(args) -> int:
    from cwlens.plotting.circuits import agreement_figure  # heavy (plotly)
    from cwlens.plotting.export import save_figure
    from cwlens.plotting.token_flow import token_flow_figure

    kwargs = _task_kwargs(args)
    out = arg_types.output_dir(args.out)
    given = figures_dir(args)  # '': none
    figures = arg_types.output_dir(given, "--figures") if given else None
    show = not args.no_progress
    handle = load_handle(args, device=args.device)
    task = circuits.build_task(args.task, handle, **kwargs)
    batch = task.clean.shape[0]
    print(f"cwlens circuits: {args.model}, {handle.n_layers} layers x {handle.n_heads} heads; "
          f"patching mode {args.mode}: {4 + handle.n_layers} forward passes, "
          f"{(4 + handle.n_layers * handle.n_heads) * batch} sequences ({batch} prompts, once per "
          "head in each layer's pass)", flush=True)
    # forward passes: the clean (cached) and corrupted runs score every head, two more
    # prepare the patching, then one per layer patches its heads (the batch once per
    # head). The bar counts sequences run, not passes: a patching pass runs n_heads times
    # the batch, so counting passes set the first time left at half the real one (3:17 of 7 min)
    with bar((4 + handle.n_layers * handle.n_heads) * batch,
             f"{task.name}: forward passes ({4 + handle.n_layers}, {handle.n_heads} heads patched "
             f"per layer)", "seq", enabled=show, ticks=True):
        comparison = circuits.compare_with_patching(handle, task, k=args.k, mode=args.mode)
    print(comparison.format(top=args.top), flush=True)

    status("token flow of prompt 0 ...", show)
    tokens = task.clean[:1]
    _, cache = circuits.run_with_cache(handle, tokens)
    flow = circuits.token_flow(cache, handle, rule=args.rule, str_tokens=handle.to_str_tokens(tokens[0]))
    target = task.queries[-1]
    inputs = flow.input_attribution(target)
    order = inputs.abs().argsort(descending=True)[:5].tolist()
    print(f"\ntoken flow ({args.rule} rule) into position {target} {flow.str_tokens[target]!r} of prompt 0, "
          "top input tokens: " + ", ".join(f"{j}:{flow.str_tokens[j]!r} {float(inputs[j]):+.3f}" for j in order))

    out.mkdir(parents=True, exist_ok=True)
    comparison.to_dataframe().to_csv(out / f"{task.name}_heads.csv", index=False)
    comparison.agreement_dataframe().to_csv(out / f"{task.name}_agreement.csv", index=False)
    edges = flow.edges_dataframe(target, args.threshold)
    edges.to_csv(out / f"{task.name}_flow_edges.csv", index=False)
    written = [out / f"{task.name}_{n}.csv" for n in ("heads", "agreement", "flow_edges")]
    if figures is not None:
        status(f"drawing the figures into {figures}/ ...", show)
        written += save_figure(agreement_figure(comparison, model_label=args.model),
                               figures / f"circuits_{task.name}_agreement", png=not args.no_png)
        source = f"{args.model}, {task.name} prompt 0 of {task.clean.shape[0]}"
        written += save_figure(token_flow_figure(flow, target, args.threshold, source=source),
                               figures / f"circuits_{task.name}_token_flow", png=not args.no_png)
    print(f"{len(edges)} flow edges with |weight| >= {args.threshold}"
          + (" (none: the largest |weight| is "
             f"{float(flow.edges_dataframe(target, 0.0)['weight'].abs().max()):.3f}; lower --threshold)"
             if edges.empty else ""))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
