"""The job engine: resumable, sharded, locked runs (:mod:`cwlens.runs.jobs`), the results
folders and their locks (:mod:`cwlens.runs.results_io`) and torchrun sessions
(:mod:`cwlens.runs.distributed`). The studies run their work through it. Nothing is imported
here.
"""
