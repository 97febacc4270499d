"""The tensors cwlens reads and returns, with their shapes (TransformerLens dim names).

=====================  ==========================================  ===========================
name                   shape                                       where it comes from
=====================  ==========================================  ===========================
``Pattern``            ``[batch, head_index, query_pos, key_pos]``  ``blocks.{l}.attn.hook_pattern``
``Values``             ``[batch, key_pos, kv_head, d_head]``        ``blocks.{l}.attn.hook_v``
                                                                   (GQA keeps the kv heads;
                                                                   ``kv_head == head_index``
                                                                   without GQA)
``HeadZ``              ``[batch, query_pos, head_index, d_head]``   ``blocks.{l}.attn.hook_z``
``WO``                 ``[head_index, d_head, d_model]``            ``model.blocks[l].attn.W_O``
``Residual``           ``[batch, pos, d_model]``                    ``blocks.{l}.hook_attn_out``
``PairWeights``        ``[batch, head_index, query_pos, key_pos]``  every per-head measure
``TokenWeights``       ``[batch, query_pos, key_pos]``              head-summed (token level)
``QueryNorms``         ``[batch, head_index, query_pos]``           ``||o_i||`` per head
``KeyNorms``           ``[batch, head_index, key_pos]``             ``||v~_j||`` per head
=====================  ==========================================  ===========================

When several layers are asked for, results get a leading ``layer`` axis.
All results are ``float32`` whatever the cache dtype.
"""

import torch
from jaxtyping import Bool, Float

from cwlens.metrics import GEOMETRY, HIERARCHY

Pattern = Float[torch.Tensor, "batch head_index query_pos key_pos"]
Values = Float[torch.Tensor, "batch key_pos kv_head d_head"]
HeadZ = Float[torch.Tensor, "batch query_pos head_index d_head"]
WO = Float[torch.Tensor, "head_index d_head d_model"]
Residual = Float[torch.Tensor, "batch pos d_model"]
PairWeights = Float[torch.Tensor, "batch head_index query_pos key_pos"]
TokenWeights = Float[torch.Tensor, "batch query_pos key_pos"]
QueryNorms = Float[torch.Tensor, "batch head_index query_pos"]
KeyNorms = Float[torch.Tensor, "batch head_index key_pos"]
PositionMask = Bool[torch.Tensor, "batch pos"]

KINDS = ("intra", "inter")
# the paper's four metrics (cwlens.importance); the registry is cwlens.metrics
METRICS = HIERARCHY
# every per-entry measure the streaming engine computes (METRICS, |contribution|, alti)
STREAM_METRICS = GEOMETRY
