"""Drop one or more metrics' rows from finished faithfulness results, so that a rerun
with the full ``--metrics`` computes only those again (``cwlens faithfulness`` adds
metrics to a finished run: docs/faithfulness.md).

Used once on ``results/acc_masking``: the supervised attention x gradient of multiple
choice differentiated each row's own next-token loss until it was made the item's label
margin (docs/faithfulness.md, "attention × gradient"); its old rows were dropped and
recomputed::

    python scripts/drop_metric_rows.py results/acc_masking/smollm2-135m/capitals.jsonl.gz \\
        --metrics attention_gradient,attention_gradient_abs

The results file is rewritten atomically and its configuration's ``metrics`` loses the
dropped names. Run it only while no run writes to the folder.
"""

import argparse
import json
import sys
from pathlib import Path

from cwlens.faithfulness.results import config_path, read_config
from cwlens.runs.results_io import atomic_write_lines, atomic_write_text, complete_lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="<dataset>.jsonl or .jsonl.gz files")
    p.add_argument("--metrics", required=True, help="comma-separated metric names to drop")
    args = p.parse_args(argv)
    drop = {m for m in args.metrics.split(",") if m}
    for name in args.results:
        path = Path(name)
        cfg_file = config_path(path)
        cfg = read_config(cfg_file)
        unknown = drop - set(cfg.get("metrics", []))
        if unknown:
            print(f"{path}: its run has no metric {', '.join(sorted(unknown))}", file=sys.stderr)
            return 1
        lines = complete_lines(path)
        keep = [ln for ln in lines if json.loads(ln)["metric"] not in drop]
        atomic_write_lines(path, "".join(ln + "\n" for ln in keep))
        cfg["metrics"] = [m for m in cfg["metrics"] if m not in drop]
        atomic_write_text(cfg_file, json.dumps(cfg, indent=1, sort_keys=True))
        print(f"{path}: {len(lines) - len(keep)} of {len(lines)} rows dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
