# The two commands of the README. Both set up what they need (scripts/setup.sh).
.PHONY: demo test setup bench replicate

demo:
	@bash scripts/setup.sh
	.venv/bin/cwlens demo

test:
	@bash scripts/setup.sh --tl3 --gemma --minilm
	bash scripts/test.sh

bench:
	@bash scripts/setup.sh
	.venv/bin/python scripts/benchmark.py

# the paper's claims on SmolLM2-135M, Gemma-3-270M and all-MiniLM-L6-v2 (resumable; on 2 shared
# CPU cores SmolLM2 took ~2.3 h, MiniLM 8 min, Gemma-3 many hours: each masked pass scores
# a 262k-token vocabulary); writes runs/replicate, figures/replicate_aopc_*, docs/replication.md
replicate:
	@bash scripts/setup.sh --gemma --minilm
	.venv/bin/cwlens replicate --docs docs/replication.md
