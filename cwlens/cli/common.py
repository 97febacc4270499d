"""Flags shared by every subcommand, so they read the same everywhere."""

import argparse


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="smollm2-135m",
        help="short name, local Hugging Face directory or hub id (default: %(default)s, offline)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: cuda if available)")
