"""``cwlens accuracy``: the clean accuracy of multiple-choice datasets, against chance."""

import argparse

from cwlens.cli import arg_types
from cwlens.cli.common import add_model_args, add_progress_flag, load_handle

DESCRIPTION = """\
Scores every item of each multiple-choice dataset on the clean model (log-likelihood of
each choice, as lm-eval-harness) and prints its accuracy with an exact 95% interval
(Clopper-Pearson) and the chance level (mean 1/k over the items). A dataset is "above
chance" when the interval's lower end is above chance: only there can accuracy under
masking (cwlens faithfulness --dataset <it> --require-above-chance) tell metrics apart.
The circuit tasks ioi, induction and capitals are the ones small models solve.
--prompt chat asks an instruction-tuned model in its own chat template: mmlu and boolq
become one user turn (zero-shot) and the answer is the assistant's first token ("A".."D",
"No"/"Yes"; cwlens.datasets.chat_prompts); the other datasets keep their plain prompts
(the table says which prompt each row used).
"""

EPILOG = """\
examples:
  cwlens accuracy --dataset ioi,induction,capitals
  cwlens accuracy --dataset ioi,boolq,winogrande --samples ioi=300,boolq=200,winogrande=200
  cwlens accuracy --dataset ioi,induction,capitals --summary-md docs/faithfulness.md
  cwlens accuracy --model qwen2.5-coder-0.5b --dataset mmlu,boolq,winogrande --prompt chat
"""

PROMPTS = ("plain", "chat")
START, END = "<!-- clean-accuracy:start -->", "<!-- clean-accuracy:end -->"


def register(sub) -> None:
    p = sub.add_parser(
        "accuracy", help="clean accuracy of multiple-choice datasets, with its interval and chance",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    p.add_argument("--dataset", default="ioi,induction,capitals",
                   type=arg_types.dataset_list(("choice",)),
                   help="comma-separated multiple-choice datasets (default: %(default)s)")
    p.add_argument("--samples", default=None, type=arg_types.samples_spec,
                   help="items per dataset: one number, or name=N,... (default: all)")
    p.add_argument("--prompt", choices=PROMPTS, default="plain",
                   help="plain: lm-eval's prompts; chat: mmlu and boolq as a user turn of the "
                   "model's chat template, zero-shot (default: %(default)s)")
    p.add_argument("--batch-tokens", type=arg_types.positive_int, default=2048,
                   help="padded tokens per forward pass (default: %(default)s)")
    p.add_argument("--no-bos", action="store_true",
                   help="score each choice without the BOS token TransformerLens prepends by "
                   "default (for a model trained without one; it changes the accuracy)")
    p.add_argument("--summary-md", default=None, type=arg_types.markdown_list,
                   help="write the table into these markdown files, comma-separated "
                   "(between <!-- clean-accuracy:start/end --> comments)")
    add_progress_flag(p)
    p.set_defaults(func=run)


def _count(spec, dataset: str) -> int | None:
    from cwlens.errors import InvalidArgumentError

    if spec is None or isinstance(spec, int):
        return spec
    if dataset not in spec:
        raise InvalidArgumentError(f"--samples has no count for {dataset}; give one for each "
                                   "--dataset, e.g. " + f"{dataset}=200")
    return spec[dataset]


def markdown(checks, model: str, prompts: dict[str, str] | None = None) -> str:
    """The clean-accuracy table of ``checks`` (:class:`~cwlens.faithfulness.accuracy.CleanAccuracy`);
    with ``prompts`` (dataset -> "plain" / "chat") a prompt column."""
    lines = [f"Clean accuracy of {model}, exact 95% interval (Clopper–Pearson); above chance = "
             "the interval's lower end is above chance (chance = the better of uniform guessing and "
             "always giving the same answer).", ""]
    if prompts:
        lines += ["| dataset | prompt | n | accuracy [95% CI] | chance | verdict |",
                  "|---|---|---|---|---|---|"]
    else:
        lines += ["| dataset | n | accuracy [95% CI] | chance | verdict |", "|---|---|---|---|---|"]
    for c in checks:
        prompt = f" {prompts.get(c.dataset, 'plain')} |" if prompts else ""
        lines.append(f"| {c.dataset} |{prompt} {c.n} | {100 * c.accuracy:.1f}% [{100 * c.low:.1f}, "
                     f"{100 * c.high:.1f}] | {100 * c.chance:.1f}%{c.chance_note()} | {c.verdict} |")
    return "\n".join(lines) + "\n"


def prompt_of(dataset: str, prompt: str) -> str:
    """The prompt ``dataset`` is scored with under ``--prompt``: chat only where it has a
    chat form (:data:`cwlens.datasets.CHAT_DATASETS`)."""
    from cwlens.datasets import CHAT_DATASETS

    return "chat" if prompt == "chat" and dataset in CHAT_DATASETS else "plain"


def run(args) -> int:
    counts = {d: _count(args.samples, d) for d in args.dataset}
    extra = [d for d in args.samples or {} if d not in args.dataset] if isinstance(args.samples, dict) else []
    if extra:  # a typo (capital=3) would go unnoticed
        from cwlens.errors import InvalidArgumentError

        raise InvalidArgumentError(f"--samples gives a count for {', '.join(extra)}, which "
                                   f"--dataset ({','.join(args.dataset)}) does not list")
    from cwlens.faithfulness.report import check_block

    md = [arg_types.markdown_file(p, "--summary-md") for p in (args.summary_md or "").split(",") if p]
    for path in md:
        check_block(path, START, END)
    from cwlens.datasets import load_dataset

    items = {d: load_dataset(d, n=counts[d]) for d in args.dataset}  # too many samples: fails here
    from cwlens.faithfulness.accuracy import clean_accuracy

    handle = load_handle(args)
    from cwlens.engine.adapter import require_next_token_model

    require_next_token_model(handle.info, "cwlens accuracy", "Use a decoder (a causal language model).")
    prompts = {d: prompt_of(d, args.prompt) for d in args.dataset}
    if "chat" in prompts.values():


        chat = handle.chat_prompt
        items.update({d: load_dataset(d, n=counts[d], chat=chat)
                      for d, p in prompts.items() if p == "chat"})
    from cwlens.faithfulness.units import choice_units

    for d in args.dataset:  # every dataset's lengths before any scoring (seconds: tokens only)
        choice_units(handle, items[d], not args.no_bos)
    from cwlens.runs.progress import bar

    checks = []
    for d in args.dataset:
        with bar(len(items[d]), f"{d}: clean accuracy", "item", enabled=not args.no_progress,
                 ticks=True):
            checks.append(clean_accuracy(handle, items[d], batch_tokens=args.batch_tokens,
                                         prepend_bos=not args.no_bos))
        print(checks[-1].line(), flush=True)
    text = markdown(checks, args.model, prompts if args.prompt == "chat" else None)
    print()
    print(text)
    from cwlens.faithfulness.report import write_block

    for path in md:
        write_block(path, text, START, END)
        print(f"table written to {path}")
    return 0
