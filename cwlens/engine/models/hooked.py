"""TransformerLens 3.x: a ``HookedTransformer`` (or ``HookedEncoder``) from a local directory.

``HookedTransformer.from_pretrained`` only takes names from TransformerLens' official
list, so a local directory goes through the lower-level loading functions instead, with
every weight processing step off (the same raw weights as
``from_pretrained_no_processing``, hence the same geometry as the TransformerBridge).
Hub names go through ``from_pretrained_no_processing`` directly.
Tested with transformer-lens 3.9.0.
"""

import os

import torch

from cwlens.errors import ModelNotAvailableError

NO_PROCESSING = dict(
    fold_ln=False, center_writing_weights=False, center_unembed=False,
    fold_value_biases=False, refactor_factored_attn_matrices=False,
)


def load_hooked(source: str, hub_id: str, device="cpu", dtype=torch.float32):
    try:
        from transformer_lens import HookedTransformer  # heavy: transformer_lens, imported on use
    except ImportError as err:
        raise ModelNotAvailableError(
            "transformer_lens is not installed: pip install transformer-lens"
        ) from err
    if not os.path.isdir(source):
        return HookedTransformer.from_pretrained_no_processing(source, device=device, dtype=dtype)
    return load_local_hooked(source, device=device, dtype=dtype)


def load_local_hooked(path: str, device="cpu", dtype=torch.float32):
    # heavy: transformer_lens, transformers, imported on use
    import transformer_lens.loading_from_pretrained as loading
    from transformer_lens import HookedTransformer
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = os.path.abspath(path)
    name = os.path.basename(path).lower()
    for word in ("llama", "gemma", "bert", "t5"):
        if word in name:
            raise ModelNotAvailableError(
                f"TransformerLens 3.x picks the architecture from the directory name, and "
                f"{os.path.basename(path)!r} contains {word!r}, which makes it skip config.json. "
                "Rename or symlink the directory (e.g. to 'model') and pass that path."
            )
    hf_config = AutoConfig.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if hf_config.model_type == "bert":
        return _load_encoder(path, tokenizer, device, dtype)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if hf_config.model_type == "gemma3_text":
        from transformer_lens.pretrained.weight_conversions import convert_gemma_weights

        cfg = _gemma3_text_cfg(hf.config, dtype, device)
        state = convert_gemma_weights(hf, cfg)
    else:
        cfg = loading.get_pretrained_model_config(
            path, hf_cfg=hf.config.to_dict(), fold_ln=False, device=device, dtype=dtype
        )
        state = loading.get_pretrained_state_dict(path, cfg, hf_model=hf, dtype=dtype)
    model = HookedTransformer(cfg, tokenizer, move_to_device=False)
    model.load_and_process_state_dict(state, **NO_PROCESSING)
    return model.to(device).eval()


def _load_encoder(path, tokenizer, device, dtype):
    # heavy: transformer_lens, transformers, imported on use
    import transformer_lens.loading_from_pretrained as loading
    from transformer_lens import HookedEncoder
    from transformers import BertForPreTraining

    # TL 3.x's BERT converter wants the pooler and NSP head (unused by attention).
    hf = BertForPreTraining.from_pretrained(path, dtype=dtype).eval()
    cfg = loading.get_pretrained_model_config(path, fold_ln=False, device=device, dtype=dtype)
    state = loading.get_pretrained_state_dict(path, cfg, hf_model=hf, dtype=dtype)
    model = HookedEncoder(cfg, tokenizer, move_to_device=False)
    model.load_state_dict(state, strict=False)
    return model.to(device).eval()


def _gemma3_text_cfg(hf_cfg, dtype, device):
    """TL 3.x has no config-driven Gemma-3 branch (only fixed google/gemma-3-* sizes)."""
    from transformer_lens import HookedTransformerConfig  # heavy: transformer_lens, imported on use

    rope = getattr(hf_cfg, "rope_parameters", None) or {}
    return HookedTransformerConfig(
        d_model=hf_cfg.hidden_size, d_head=hf_cfg.head_dim, n_heads=hf_cfg.num_attention_heads,
        n_key_value_heads=hf_cfg.num_key_value_heads, d_mlp=hf_cfg.intermediate_size,
        n_layers=hf_cfg.num_hidden_layers, n_ctx=hf_cfg.max_position_embeddings,
        eps=hf_cfg.rms_norm_eps, d_vocab=hf_cfg.vocab_size, act_fn=hf_cfg.hidden_activation,
        normalization_type="RMS", positional_embedding_type="rotary",
        rotary_dim=hf_cfg.head_dim,
        rotary_base=rope.get("full_attention", {}).get("rope_theta", 1_000_000),
        rotary_base_local=rope.get("sliding_attention", {}).get("rope_theta", 10_000),
        use_attn_scale=True, attn_scale=float(hf_cfg.query_pre_attn_scalar) ** 0.5,
        gated_mlp=True, final_rms=True, use_normalization_before_and_after=True,
        use_qk_norm=True, window_size=hf_cfg.sliding_window, use_local_attn=True,
        attn_types=["local" if t == "sliding_attention" else "global" for t in hf_cfg.layer_types],
        original_architecture="Gemma3ForCausalLM", model_name="gemma3-local",
        default_prepend_bos=True, dtype=dtype, device=device, init_weights=False,
    )
