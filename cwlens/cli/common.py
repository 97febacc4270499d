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
