"""The engine: the run-time over a TransformerLens model.

The bound model handle (:mod:`cwlens.engine.handle`), model loading
(:mod:`cwlens.engine.models`), hook names, batching and input checks, the measures, the
streaming engine and its reducers, the gradient scores and the interventions (value masking,
sink edits). It uses :mod:`cwlens.core` (pure math) and nothing above it: the job engine
(:mod:`cwlens.runs`), the studies and the presentation layers build on it. Nothing is
imported here, so importing a submodule stays cheap.
"""
