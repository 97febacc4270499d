# The two commands of the README. Both set up what they need (scripts/setup.sh).
.PHONY: demo test setup bench

demo:
	@bash scripts/setup.sh
	.venv/bin/cwlens demo

test:
	@bash scripts/setup.sh --tl3 --gemma --minilm
	bash scripts/test.sh

bench:
	@bash scripts/setup.sh
	.venv/bin/python scripts/benchmark.py
