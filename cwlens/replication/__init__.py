"""The paper's claims on several models, from one resumable command (``cwlens replicate``).

For each model, :mod:`~cwlens.replication.stages` runs into ``<out>/<model>/``:

decoders (next-token models)
    ``faithfulness/`` value masking at rates 0.01..0.5, every metric of the registry (the
    paper's four, ``contribution_abs``, the peers' ``alti`` and the supervised
    ``attention_gradient``/``_abs``, the random control), both modes;
    ``sinks/`` the sink analysis with the sink-norm intervention;
    ``token_classes.csv`` attention vs norm-weighted share of special tokens and
    punctuation; and, for one decoder, ``per_layer/`` masking one layer at a time.
encoders
    ``faithfulness/`` the sentence-embedding damage task
    (:mod:`cwlens.faithfulness.encoder`) at the same rates; ``sinks/`` without the
    intervention (it needs a next-token loss); ``token_classes.csv`` (Kobayashi et al. 2020).

Every stage writes as it goes and a rerun computes only what is missing.
:mod:`~cwlens.replication.claims` reads the folders and builds the one cross-model table
of claims (:func:`~cwlens.replication.claims.claims_table`).
"""

from cwlens.replication.plan import DEFAULT_MODELS, ReplicationConfig
from cwlens.replication.stages import run_model

__all__ = ["DEFAULT_MODELS", "ReplicationConfig", "run_model"]
