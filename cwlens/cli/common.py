"""Flags shared by every subcommand, so they read the same everywhere."""

import argparse

from cwlens.cli import arg_types


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="smollm2-135m",
        help="short name, local Hugging Face directory or hub id (default: %(default)s, offline)",
    )
    p.add_argument("--device", default=None, type=arg_types.device,
                   help="cpu, cuda, cuda:1, mps (default: cuda if available)")
    add_debug_flag(p, argparse.SUPPRESS)


def add_debug_flag(p: argparse.ArgumentParser, default=False) -> None:
    """``--debug``: show the full traceback of an error (before or after the subcommand)."""
    p.add_argument("--debug", action="store_true", default=default,
                   help="on an error, show the full traceback instead of one line")


def add_past_context_flag(p: argparse.ArgumentParser) -> None:
    """``--past-context``: texts run past the model's context instead of being cut there
    (rotary models; refused with exit 2 on learned-position ones). Read as
    ``args.past_context`` into each command's configuration (docs/inputs.md)."""
    p.add_argument(
        "--past-context", action="store_true",
        help="run texts past the model's context (n_ctx) instead of cutting them there: "
        "rotary-position models only (Llama, Mistral, Qwen, Gemma, SmolLM2), which run on at "
        "positions never seen in training (a note says so); refused on learned-position "
        "models (GPT-2, BERT)")
