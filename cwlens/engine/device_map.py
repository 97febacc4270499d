"""Device maps for :func:`cwlens.load_model`: the ``device_map`` strategies, the parsing of
``--device-map`` and the check that a map names only devices this machine has. Model
loading (here) refuses a bad map before anything loads; :mod:`cwlens.runs.distributed`
places each torchrun rank with the same checks.
"""

import json
import os

from cwlens.errors import InvalidArgumentError

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


class PlacementError(InvalidArgumentError):
    """A device / n_devices / device_map / max_memory value or combination that cannot work
    (an :class:`~cwlens.errors.InvalidArgumentError`, so a ``CwlensError`` and a ``ValueError``)."""


def parse_device_map(text: str) -> str | dict:
    """``--device-map``: a strategy (:data:`DEVICE_MAP_STRATEGIES`), a JSON object
    (``'{"model.embed_tokens": 0, ...}'``) or the path of a ``.json`` file holding one."""
    text = text.strip()
    if text in DEVICE_MAP_STRATEGIES:
        return text
    source = text
    if not text.startswith("{"):
        if not os.path.isfile(text):
            raise PlacementError(
                f"--device-map {text!r} is none of {', '.join(DEVICE_MAP_STRATEGIES)}, not a "
                "JSON object and not a .json file.")
        with open(text, encoding="utf-8") as f:
            source = f.read()
    try:
        value = json.loads(source)
    except ValueError as e:
        raise PlacementError(f"--device-map {text!r}: not valid JSON ({e}).") from None
    if not isinstance(value, dict) or not value:
        raise PlacementError(f"--device-map {text!r}: expected a JSON object module -> device.")
    return value


def check_device_map(device_map: str | dict | None, cuda_count: int, flag: str = "--device-map") -> None:
    """Refuse a device map that names a GPU this machine does not have (or a device torch
    does not know), before anything loads."""
    if not isinstance(device_map, dict):
        return
    for module, where in device_map.items():
        text = str(where).strip()
        gpu: int | None = None
        if isinstance(where, int) and not isinstance(where, bool):
            gpu = where
        elif text.isdigit():
            gpu = int(text)
        elif text == "cuda" or text.startswith("cuda:"):
            index = text.partition(":")[2]
            gpu = int(index) if index.isdigit() else 0
        elif text not in ("cpu", "disk", "meta", "mps"):
            raise PlacementError(
                f"{flag} puts {module!r} on {where!r}, which is not a device: use a GPU index, "
                "'cuda:N', 'cpu' or 'disk'.")
        if gpu is not None and gpu >= cuda_count:
            have = "no CUDA GPU" if cuda_count == 0 else f"{cuda_count} (0..{cuda_count - 1})"
            raise PlacementError(
                f"{flag} puts {module!r} on GPU {gpu}, but this machine has {have}: put it on "
                "'cpu' in the map, or drop " + flag + " and pass --device cpu.")
