# The two commands of the README. Both set up what they need (scripts/setup.sh); only
# `make test` installs a system package (chromium, with --browser: the browser tests need it).
.PHONY: demo test setup bench replicate

demo:
	@bash scripts/setup.sh
	.venv/bin/cwlens demo

test:
	@bash scripts/setup.sh --browser --tl3 --gemma --minilm --tracr
	bash scripts/test.sh

bench:
	@bash scripts/setup.sh
	.venv/bin/python scripts/benchmark.py

# the paper's claims on SmolLM2-135M, Gemma-3-270M and all-MiniLM-L6-v2. results/replicate
# ships the raw outputs of the run behind docs/replication.md, so this resumes from them:
# only the sink stage (its per-batch store is not shipped) is recomputed, in minutes;
# `rm -r results/replicate` first to recompute everything (about 2 h on 2 CPU cores). Writes results/replicate, figures/replicate_*, docs/replication.md
# (each named explicitly: a plain `cwlens replicate` writes into runs/replicate only)
replicate:
	@bash scripts/setup.sh --gemma --minilm
	.venv/bin/cwlens replicate --out results/replicate --figures figures --docs docs/replication.md
