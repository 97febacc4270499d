"""``cwlens faithfulness``'s command line as one frozen request: every value the command
resolves (datasets, sample counts, the figures folder, the ``--file`` text, the
configuration, the results files) worked out and checked once, before a model loads. The
command runs from the request; the parsed flags stay as they were given."""

import argparse
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from cwlens.cli import arg_types
from cwlens.cli.accuracy import prompt_of
from cwlens.cli.common import figures_dir
from cwlens.datasets import TextSample, load_dataset
from cwlens.errors import EmptyInputError, InvalidArgumentError
from cwlens.faithfulness.config import FaithfulnessConfig
from cwlens.faithfulness.ranking import RANKINGS
from cwlens.faithfulness.report import check_block
from cwlens.faithfulness.results import split_name
from cwlens.faithfulness.results_report import AOPC_END, AOPC_START


@dataclass(frozen=True)
class FaithfulnessRequest:
    """What ``cwlens faithfulness`` was asked to do, resolved (:meth:`from_flags`)."""

    flags: argparse.Namespace  # the parsed command line as given: read, never written
    datasets: tuple[str, ...]  # --dataset, or --file's ``file_<name>``
    counts: dict[str, int]  # samples per dataset (--samples, 50 by default, 1 for --file)
    samples_given: bool  # --samples was on the command line
    figures: str  # the figures folder, '' for none (--figures, or <--out>/figures)
    file_samples: tuple[TextSample, ...]  # --file's text as one sample; () for --dataset
    config: FaithfulnessConfig
    paths: tuple[Path, ...]  # the results file of each dataset

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "FaithfulnessRequest":
        """The request of the parsed ``args`` (left unchanged); a bad combination of flags,
        count or path raises here, in the order the command has always reported them."""
        samples_given = args.samples is not None
        figures = figures_dir(args)
        datasets, samples = args.dataset, args.samples
        file_samples: tuple[TextSample, ...] = ()
        if args.file is not None:
            if samples_given:
                raise InvalidArgumentError("--samples applies to --dataset only: --file scores its "
                                           "text as one document; drop --samples")
            samples, file_samples = 1, _file_samples(args.file)  # one document
            datasets = (_file_dataset(args.file),)
        elif not samples_given:
            samples = 50
        counts = _samples(samples, datasets)
        if args.num_fewshot and "mmlu" not in datasets:
            raise InvalidArgumentError("--num-fewshot applies to mmlu only, and --dataset has no mmlu")
        if args.num_fewshot and args.prompt == "chat":
            raise InvalidArgumentError("--prompt chat is zero-shot: leave out --num-fewshot, or use "
                                       "--prompt plain for MMLU with exemplars")
        config = _config(args)
        paths = _check_inputs(args, datasets, counts, figures)
        return cls(args, datasets, counts, samples_given, figures, file_samples, config, paths)


def _samples(spec: int | dict[str, int], datasets: tuple[str, ...]) -> dict[str, int]:
    if isinstance(spec, int):
        return {d: spec for d in datasets}
    missing = [d for d in datasets if d not in spec]
    if missing:
        raise InvalidArgumentError(
            f"--samples has no count for {', '.join(missing)}; give one for each --dataset, "
            "e.g. " + ",".join(f"{d}=50" for d in datasets)
        )
    extra = [d for d in spec if d not in datasets]
    if extra:
        raise InvalidArgumentError(
            f"--samples gives a count for {', '.join(extra)}, which --dataset "
            f"({','.join(datasets)}) does not list"
        )
    return dict(spec)


def _config(args) -> FaithfulnessConfig:
    return FaithfulnessConfig(
        metrics=args.metrics or RANKINGS, rates=args.rates, modes=args.modes, scope=args.scope,
        layers=args.layers, per_layer=args.per_layer, kind=args.kind,
        causal_only=not args.non_causal, mask_first_token=not args.protect_first_token,
        renormalize=args.renormalize, seed=args.seed, max_tokens=args.max_tokens,
        batch_tokens=args.batch_tokens, past_context=args.past_context,
        prepend_bos=not args.no_bos, ranking_path=args.ranking_path,
    )


def _check_inputs(args, datasets: tuple[str, ...], counts: dict[str, int],
                  figures: str) -> tuple[Path, ...]:
    """Everything that can be checked without the model: counts, paths. Returns the
    results files."""
    out = arg_types.output_dir(args.out, must_write=False)
    paths = []
    for d in datasets:
        shots = args.num_fewshot if d == "mmlu" else 0
        if not args.report_only and args.file is None:
            load_dataset(d, n=counts[d], num_fewshot=shots)  # too many samples: fails here
        chat = "_chat" if prompt_of(d, args.prompt) == "chat" else ""
        paths.append(_results_path(out, f"{d}{f'_{shots}shot' if shots else ''}{chat}",
                                   args.compress, fresh=args.no_resume and not args.report_only))
    if args.report_only:
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            there = sorted({split_name(p)[0] for p in [*out.glob("*.jsonl"), *out.glob("*.jsonl.gz")]
                            if ".shard-" not in p.name}) if out.is_dir() else []
            hint = (f"; {out} holds results of {', '.join(there)}: pass --dataset (or, for "
                    "file_<name>, the same --file)" if there else "")
            raise InvalidArgumentError(
                f"--report-only: no results in {', '.join(missing)}; run without --report-only "
                f"first, or pass the --out of that run{hint}"
            )
    elif args.no_resume or not all(p.is_file() for p in paths):
        arg_types.output_dir(out)  # something will be written: it must be writable now
    if figures:
        arg_types.output_dir(figures, "--figures")
    for md in filter(None, (args.summary_md or "").split(",")):
        arg_types.markdown_file(md, "--summary-md")
        check_block(md)
        check_block(md, AOPC_START, AOPC_END)
    return tuple(paths)


def _results_path(out: Path, name: str, compress: bool, fresh: bool = False) -> Path:
    """``<out>/<name>.jsonl``, or ``.jsonl.gz`` under --compress or where only that exists
    (``fresh``, --no-resume: the writer deletes both, so either may be there)."""
    plain, packed = out / f"{name}.jsonl", out / f"{name}.jsonl.gz"
    if fresh:
        return packed if compress else plain
    if plain.is_file() and packed.is_file():
        raise InvalidArgumentError(
            f"{out} holds both {plain.name} and {packed.name}: keep one (gzip the plain file "
            f"into the other with 'gzip -c {plain} >> {packed}', then delete it) and rerun")
    if compress and plain.is_file():
        raise InvalidArgumentError(
            f"--compress: {plain} holds this run's rows uncompressed; compress it first "
            f"('gzip {plain}', which resumes as {packed.name}) or leave out --compress")
    return packed if compress or packed.is_file() else plain


def _file_dataset(path: str) -> str:
    """The dataset name of a ``--file`` run: ``file_<file name>`` (``file_stdin`` for -)."""
    stem = "stdin" if path == "-" else Path(path).stem
    return "file_" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", stem) or "text")


def _file_samples(path: str) -> tuple[TextSample, ...]:
    """``--file``: the file as one :class:`~cwlens.datasets.TextSample`."""
    text = arg_types.read_text(path)
    if not text.strip():
        raise EmptyInputError(f"--file {path}: the text is empty; pass a non-empty text file")
    name = _file_dataset(path)  # the id carries the text's hash: another text under
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]  # the same name is refused
    return (TextSample(f"{name}-{digest}", text, name),)
