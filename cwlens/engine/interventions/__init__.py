"""Interventions on attention, as TransformerLens hooks applied in context managers.

``value_masking``: remove chosen terms ``a_ij^h v~_j^h`` from head outputs (faithfulness).
"""

from cwlens.engine.interventions.value_masking import (
    hooks_applied,
    masking_hooks,
    pattern_mask_hook,
    run_masked,
    value_masking,
)

__all__ = ["hooks_applied", "masking_hooks", "pattern_mask_hook", "run_masked", "value_masking"]
