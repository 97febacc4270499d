"""``load_model``: a TransformerLens model from a short name, a local directory or a hub id.

TransformerLens 4.x gives a ``TransformerBridge`` (raw Hugging Face weights unless
``compatibility_mode=True``, which folds LayerNorm and centres the writing weights: that
changes W_O and so the norms and cosines, not the model's function; the value biases
stay unfolded, in ``hook_v``, so the heads' outputs keep their b_V term). TransformerLens 3.x
gives a ``HookedTransformer`` loaded without weight processing (same raw geometry).
"""

import os
from pathlib import Path

import torch

from cwlens.errors import ModelNotAvailableError, UnknownOptionError
from cwlens.models.gguf_local import dequantized_dir
from cwlens.models.pattern_seam import enable_pattern_edits
from cwlens.models.registry import MODELS, describe_models

DEFAULT_MODEL = "smollm2-135m"


def resolve(name_or_path: str) -> tuple[str, str]:
    """``(source, hub_id)``: source is a local directory or a hub id to load from."""
    entry = MODELS.get(name_or_path.lower())
    if entry is not None:
        if entry.offline is not None:
            return str(dequantized_dir(name_or_path.lower(), entry.offline)), entry.hub_id
        return entry.hub_id, entry.hub_id
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotAvailableError(
                f"{path} exists but has no config.json: pass a Hugging Face model directory "
                "(as written by save_pretrained), a hub id, or one of:\n" + describe_models()
            )
        return str(path), str(path)
    if "/" not in name_or_path and name_or_path not in ("gpt2",):
        raise ModelNotAvailableError(
            f"Unknown model {name_or_path!r}: not a short name, not a local directory. "
            "Pass a hub id such as 'meta-llama/Llama-3.1-8B' (needs network), a local "
            "directory, or one of:\n" + describe_models()
        )
    return name_or_path, name_or_path


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    compatibility_mode: bool = False,
    generation: str = "auto",
    n_devices: int | None = None,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
):
    """Load a TransformerLens model.

    Args:
        name_or_path: a short name (``"smollm2-135m"`` works offline; ``"llama-3.1-8b"``,
            ``"mistral-7b"``, ``"qwen3-8b"``, ``"deepseek-7b"``, ``"gpt2"``,
            ``"gemma-3-270m"`` load from the hub), a local HF directory or a hub id.
        device: ``"cpu"``, ``"cuda"``... (default: cuda if available).
        dtype: weights dtype; cwlens computes its measures in float32 anyway.
        compatibility_mode: TransformerBridge only: fold LayerNorm and centre weights
            (value biases are kept in the heads: ``fold_value_biases=False``).
        generation: ``"bridge"`` (TransformerLens 4.x), ``"hooked"`` (3.x
            ``HookedTransformer``) or ``"auto"`` (bridge on 4.x, hooked on 3.x).
        n_devices: split the model over this many CUDA GPUs (``0..n-1``; TransformerBridge
            only). Under torchrun, :func:`cwlens.distributed.placement` gives each rank its
            own group of GPUs instead (a ``device_map`` strategy with ``max_memory``).
        device_map: a Hugging Face device map (``"auto"``, ``"balanced"``,
            ``"sequential"``, or ``{module: device}``); exclusive with ``device``.
        max_memory: per-device budget for the device map (``{gpu index: bytes}``).

    Raises:
        PlacementError: ``device`` with ``device_map``, ``n_devices < 1`` or more than the
            visible GPUs, or multi-device loading on TransformerLens 3.x.
    """
    from cwlens.distributed import PlacementError

    multi = device_map is not None or (n_devices or 1) > 1 or max_memory is not None
    if device_map is not None and device is not None:
        raise PlacementError(f"device={device!r} and device_map are exclusive: pass one.")
    if n_devices is not None:
        if n_devices < 1:
            raise PlacementError(f"n_devices must be at least 1; got {n_devices}.")
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n_devices > 1 and n_devices > visible:
            raise PlacementError(f"n_devices={n_devices} needs {n_devices} CUDA GPUs; "
                                 f"{visible} are visible. Lower n_devices.")
        if n_devices > 1 and device is not None and str(device) != "cuda":
            raise PlacementError(f"n_devices={n_devices} picks the GPUs itself; pass device=None "
                                 f"or 'cuda', not {device!r}.")
    if multi:
        device = None  # the bridge places the model (device and device_map are exclusive)
    elif device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    source, hub_id = resolve(name_or_path)
    if os.path.isdir(source):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory needs no network
    if generation == "auto":
        generation = "bridge" if _has_bridge() else "hooked"
    if generation == "bridge":
        from transformer_lens.model_bridge import TransformerBridge

        placed = {k: v for k, v in (("n_devices", n_devices), ("device_map", device_map),
                                    ("max_memory", max_memory)) if v is not None}
        model = TransformerBridge.boot_transformers(source, device=device, dtype=dtype, **placed)
        if compatibility_mode:
            # TL 4.3 folds b_V into b_O by default: hook_v would lose b_V and every head
            # output its term sum_j a_ij b_V = b_V. Keep it in the heads (as raw mode and
            # TL 3.x without processing do); W_O is still centred.
            model.enable_compatibility_mode(fold_value_biases=False)
        enable_pattern_edits(model)  # hook_pattern edits act on wrapped (BERT) attention too
        return model
    if generation == "hooked":
        if multi:
            raise PlacementError(
                "n_devices / device_map need the TransformerBridge (TransformerLens 4.x); "
                "the 3.x HookedTransformer loads on one device here.")
        from cwlens.models.hooked import load_hooked

        return load_hooked(source, hub_id, device=device, dtype=dtype)
    raise UnknownOptionError(f"generation must be 'auto', 'bridge' or 'hooked'; got {generation!r}")


def _has_bridge() -> bool:
    """TransformerLens >= 4 (where HookedTransformer is gone and the bridge is the API).

    3.x releases ship an early bridge too, but their main API is HookedTransformer.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        major = int(version("transformer-lens").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return False
    return major >= 4
