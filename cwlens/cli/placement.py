"""``--n-devices`` / ``--device-map`` and the torchrun path of ``cwlens faithfulness`` and
``cwlens sinks`` (see :mod:`cwlens.runs.distributed` and docs/distributed.md)."""

import argparse

HELP = """\
several processes, GPUs or nodes: start the same command with torchrun, e.g.
  torchrun --nproc-per-node=8 -m cwlens %(cmd)s ...
each process takes whole batches (numbers identical to one process), writes its own
files in --out, and rank 0 merges them; a rerun with any number of processes resumes.
"""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _device_map(text: str):
    from cwlens.runs.distributed import PlacementError, parse_device_map

    try:
        return parse_device_map(text)
    except PlacementError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_placement_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("devices (many GPUs: see docs/distributed.md)")
    g.add_argument("--n-devices", type=_positive, default=None,
                   help="split each copy of the model over N GPUs (TransformerLens 4.x); under "
                   "torchrun, local rank r uses GPUs r*N..r*N+N-1")
    g.add_argument("--device-map", type=_device_map, default=None,
                   help="Hugging Face device map: auto, balanced, balanced_low_0, sequential, a "
                   "JSON object or a .json file (exclusive with --device)")


def load_kwargs(args) -> dict:
    """``load_model`` keywords for this process (checked before anything loads)."""
    from cwlens.runs.distributed import check_environment, placement

    check_environment()
    return placement(args.device, getattr(args, "n_devices", None), getattr(args, "device_map", None))
