"""Cost of cwlens against the model's own forward pass (prints ratios from one run).

For each sequence length n it times, on the same random tokens:
  forward   model(tokens), no hooks
  cwlens    run_with_cache (pattern + v only) and, for every layer, the contribution
            weights (kind="inter") and the three baselines (attention, value-weighted,
            value-weighted output-normalised); each layer's tensors are computed and
            dropped (torch on CPU is synchronous; on CUDA the timer synchronises).
  +intra    the same plus the intra-head contribution weights
and reports ratio = cwlens / forward, with the median of --repeats runs, and peak memory
(CUDA: max allocated; CPU: peak RSS of a fresh subprocess per row, minus its RSS once the
model is loaded, its weights made resident and the peak reset: ``loaded_baseline_mb``).

With ``--stream`` it times the streaming engine instead (``cwlens.stream_reduce``): every
layer's contribution weights and the three baselines, computed inside the forward pass in
query blocks and reduced to per-row top-8 and per-key column sums, against the plain
forward pass at the same n (interleaved). ``peak_extra_mb`` is then the peak memory of
the streamed pass minus that of the plain forward pass (CPU: each measured alone in a
fresh subprocess, glibc's mmap threshold fixed so that freed blocks leave the RSS; CUDA:
max allocated). ``--json`` prints one JSON line per n with the keys
``n, forward_s, stream_s, ratio, peak_extra_mb, forward_peak_mb, attention, stream_peak_mb``
(the streamed run's peak above the loaded model; the eager forward's fields are null where
it did not fit) and, unless ``--attention eager``, ``forward_blockwise_s`` (the plain
forward with cwlens's blockwise attention: SDPA per query block) and ``ratio_blockwise``
(stream / that), and ``forward_alpha_s``, the floor of any method that reads the attention
weights: the blockwise forward with every layer's softmax(QK^T) materialised block by block
and dropped, stopped after the last layer like the streamed pass (``alpha_forward``), and
``ratio_alpha`` (stream / that); the four passes are timed interleaved in one process.
``--attention`` picks the streamed run's attention (``auto``, ``eager``, ``blockwise``:
see docs/long_context.md). On CPU, rows with n > 4096 run once (no repeats: each takes
minutes), the blockwise passes (streamed, SDPA, reading alpha) after one warm-up run each
up to n = 8192 (a process's first pass at a length grows the heap: at 8192 a cold streamed
pass took 67.1 s, 6.8 s of it system time: docs/benchmarks.md), the eager forward unwarmed. The timed runs use the allocator the script was
started with (``timing_env``: "as started"), except CPU rows with n > 8192, which measure
the streamed peak in their one timed run, so under the fixed mmap threshold: their times
include the page faults of returning every freed block (``stream_sys_s``, the streamed
pass's system CPU time, shows that share). glibc's default allocator keeps freed blocks for
reuse: fast, but the RSS of a streamed pass was 5-6 times its live memory at 2048-4096
tokens (``--allocators``; docs/benchmarks.md).

    python scripts/benchmark.py                      # SmolLM2-135M, n = 128 512 2048, CPU
    python scripts/benchmark.py --docs docs/benchmarks.md   # and write its table into that page
    python scripts/benchmark.py --stream --json --lengths 2048 8192 --repeats 1
    python scripts/benchmark.py --device cuda --model llama-3.1-8b --lengths 512 2048
    python scripts/benchmark.py --topk --lengths 1024 2048 4096 8192 16384   # TopK's two paths
    python scripts/benchmark.py --choice 32 --model gemma-3-270m   # multiple choice: logits made
    python scripts/benchmark.py --ranking --lengths 4096 16384   # the faithfulness row ranking
    python scripts/benchmark.py --sdpa-blocks --lengths 8192 16384   # SDPA layers' block size
    python scripts/benchmark.py --allocators --lengths 2048 8192   # glibc settings: peak, CPU time

``--choice ITEMS`` times one multiple-choice batch of the faithfulness sweep (ITEMS capitals
items) with the full ``[batch, pos, d_vocab]`` logits against the continuation positions
only (what the sweep and the lm-eval model do), and prints the largest score difference.
``--topk`` times the two ways the TopK reducer ranks a block's rows (torch.topk, and the
grouped top-k it uses from ``row_topk.GROUPED_FROM`` keys on): a [1, 9, 256, n] block of
random weights (SmolLM2's 9 heads, the default query block), CPU time of this process.
``--ranking`` times the row ranking of ``cwlens faithfulness`` on one sub-block of
``lockstep.RANK_ENTRIES`` entries of rows n keys wide: the full sort (``rank_entries``)
against the ends-only ranking (``partial_ranking``) for masks of 1%, 10% and 30% of a row.
``--sdpa-blocks`` times one causal attention layer whose probabilities nothing reads
(``blockwise_math.attend`` without a pattern hook: SDPA per block; SmolLM2's 9 heads and 3
kv heads, batch 1 and 3) in the CPU-capped blocks of the layers cwlens reads and in the
uncapped blocks that ``query_block="auto"`` gives such layers; CPU time of this process.
    python scripts/benchmark.py --stream --json --device cuda --dtype bfloat16 \
        --random-config llama-3.1-8b --lengths 2048 8192 32768     # random weights, no download
"""

import argparse
import functools
import json
import resource
import statistics
import subprocess
import sys
import time

import torch


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def loaded_baseline_mb(model) -> float:
    """The peak-RSS baseline of a CPU row: the model's weights made resident, then (Linux)
    the process's peak reset to what it holds now.

    A model loaded from safetensors maps its weights lazily: the first forward pass pages
    them in (about 500 MB for SmolLM2-135M, ~15 MB per layer), so without this the weights
    would count as the measured run's memory. Loading may also peak above what it keeps
    (dequantising a GGUF); resetting the peak (``/proc/self/clear_refs``) keeps that out of
    the baseline. Where the peak cannot be reset, the baseline is the peak so far."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.numel():
                t.reshape(-1)[:: max(1, 1024 // t.element_size())].sum()  # one read per 4 KB page
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM / ru_maxrss to the current RSS
    except OSError:
        pass
    return peak_rss_mb()


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def cwlens_pass(model, tokens, intra=False):
    import cwlens
    from cwlens.engine import adapter

    handle = cwlens.wrap(model)
    _, cache = cwlens.run_with_cache(handle, tokens)
    kept = 0
    for layer in range(model.cfg.n_layers):
        geo = adapter.geometry(cache, handle, layer)
        outs = [
            geo.contribution("inter"),
            geo.attention(),
            geo.value_weighted(),
            geo.value_weighted_output_normalized("inter"),
        ]
        if intra:
            outs.append(geo.contribution("intra"))
        kept += sum(out.numel() for out in outs)
        del geo, outs
    del cache
    return kept


def random_tokens(model, n, device):
    torch.manual_seed(0)
    lo = min(100, model.cfg.d_vocab // 4)
    return torch.randint(lo, model.cfg.d_vocab - lo, (1, n), device=device)


STREAM_METRICS = ("contribution", "attention", "value_weighted", "value_weighted_output_normalized")


def stream_pass(model, tokens, query_block=None, attention="auto"):
    """All-layer contribution + 3 baselines, streamed, reduced to top-8 and column sums
    (the forward pass stops before the unembedding: no logits are wanted)."""
    import cwlens
    from cwlens import reducers

    rs = [reducers.TopK(8, m) for m in STREAM_METRICS] + [reducers.ColumnSums(m) for m in STREAM_METRICS]
    kw = {} if query_block is None else {"query_block": query_block}
    return cwlens.stream_reduce(model, tokens, rs, attention=attention, logits=False, **kw)


def blockwise_forward(model, tokens, query_block=None):
    """The plain forward pass with cwlens's blockwise attention (no hooks: SDPA blocks)."""
    from cwlens.engine.handle import wrap
    from cwlens.engine.streaming import attention_context

    with attention_context(wrap(model), tokens, "blockwise", query_block):
        return model(tokens)


def _drop_pattern(tensor, hook):
    """Reads nothing: the block of softmax(QK^T) was computed, and is dropped on return."""
    return None


_drop_pattern.cwlens_blockwise = True  # type: ignore[attr-defined]  # takes query blocks


def alpha_forward(model, tokens, query_block=None):
    """The floor of any method that reads alpha: the blockwise forward with every layer's
    probabilities softmax(QK^T) materialised, block by block, and dropped (a hook_pattern
    that reads nothing makes each layer compute them instead of running SDPA), stopped
    after the last layer like the streamed pass (logits=False)."""
    from cwlens.engine import hook_names
    from cwlens.engine.handle import wrap
    from cwlens.engine.stream_pass import _raise_stop, _Stop
    from cwlens.engine.streaming import attention_context

    n_layers = model.cfg.n_layers
    hooks = [(hook_names.pattern(ly), _drop_pattern) for ly in range(n_layers)]
    hooks.append((hook_names.resid_post(n_layers - 1), _raise_stop))
    handle = wrap(model)
    with attention_context(handle, tokens, "blockwise", query_block), handle.hooks(hooks):
        try:
            model(tokens)
        except _Stop:
            pass


def load(model_name, device, dtype, random_config):
    import cwlens

    if random_config is None:
        return cwlens.load_model(model_name, device=device, dtype=dtype)
    from cwlens.engine.models.random_init import random_model

    return random_model(random_config, device=device, dtype=dtype)


LONG = 4096  # rows longer than this run once (CPU minutes each), the blockwise passes after a warm-up
ONE_RUN = 8192  # CPU rows longer than this measure the streamed peak in the timed run itself
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # glibc returns every freed block >= 64 KB


def one_run(n: int, device) -> bool:
    """A CPU row above ONE_RUN: its one timed streamed pass also gives its peak memory (so
    it runs under MMAP_ENV)."""
    return n > ONE_RUN and not str(device).startswith("cuda")


def stream_row(model_name, device, n, repeats, dtype, random_config=None, query_block=None,
               attention="auto", eager=True):
    """Times of the plain eager forward (unless ``eager`` is False: it does not fit), the
    plain blockwise forward and the streamed pass, interleaved. A one-shot row (CPU, n > ONE_RUN)
    runs the streamed pass first and also reports its peak memory above the loaded model
    (``stream_peak_mb``), so that the long pass is not run twice. ``stream_sys_s``: the
    streamed pass's system CPU time (page faults of fresh allocations, mostly)."""
    one_shot = one_run(n, device)
    if n > LONG and not str(device).startswith("cuda"):
        repeats = 1
    model = load(model_name, device, dtype, random_config)
    torch.manual_seed(0)
    tokens = random_tokens(model, n, device)
    base = loaded_baseline_mb(model)
    runs = [("stream", lambda: stream_pass(model, tokens, query_block, attention)),
            ("forward_blockwise", lambda: blockwise_forward(model, tokens, query_block)),
            ("forward_alpha", lambda: alpha_forward(model, tokens, query_block)),
            ("forward", lambda: model(tokens))]
    if attention == "eager":
        runs = [runs[0], runs[3]]
    if not eager:
        runs = [r for r in runs if r[0] != "forward"]
    times: dict[str, list] = {name: [] for name, _ in runs}
    stream_peak, sys_s = None, []
    with torch.no_grad():
        if repeats > 1:  # warm-up (skipped for one-shot long runs)
            for _, fn in runs:
                fn()
        elif not one_shot:  # a long row runs once: one warm-up of each blockwise pass first (the
            for name, fn in runs:  # first pass of a process grows the heap: page faults), not of
                if name != "forward":  # the eager forward (CPU minutes, no goal against it)
                    fn()
        for _ in range(repeats):
            for name, fn in runs:
                sync(device)
                t0, sys0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
                fn()
                sync(device)
                times[name].append(time.perf_counter() - t0)
                if name == "stream":
                    sys_s.append(resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys0)
                    if one_shot:
                        stream_peak = peak_rss_mb() - base
    st = statistics.median(times["stream"])
    fwd = statistics.median(times["forward"]) if "forward" in times else None
    row = {"n": n, "forward_s": fwd, "stream_s": st, "ratio": None if fwd is None else st / fwd,
           "attention": attention, "stream_sys_s": statistics.median(sys_s)}
    if "forward_blockwise" in times:
        fb = statistics.median(times["forward_blockwise"])
        row |= {"forward_blockwise_s": fb, "ratio_blockwise": st / fb}
    if "forward_alpha" in times:
        fa = statistics.median(times["forward_alpha"])
        row |= {"forward_alpha_s": fa, "ratio_alpha": st / fa}
    if stream_peak is not None:
        row["stream_peak_mb"] = stream_peak
    return row


def memory_row(model_name, device, n, dtype, what, random_config=None, query_block=None,
               attention="auto"):
    """Peak memory of one plain forward or one streamed pass, beyond the loaded model."""
    model = load(model_name, device, dtype, random_config)
    torch.manual_seed(0)
    tokens = random_tokens(model, n, device)
    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
    else:
        base = loaded_baseline_mb(model)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    with torch.no_grad():
        if what == "forward":
            model(tokens)
        else:
            stream_pass(model, tokens, query_block, attention)
    sync(device)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mb()
    return {"n": n, "what": what, "peak_mb": peak - base, "wall_s": wall,
            "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime}


ALLOCATORS = {  # glibc settings compared by --allocators (Linux)
    "default": {},
    "MALLOC_MMAP_THRESHOLD_=65536": MMAP_ENV,
    "GLIBC_TUNABLES=glibc.malloc.hugetlb=1": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    # PyTorch's own switch: tensors >= 2 MB on transparent huge pages (read once, at import)
    "THP_MEM_ALLOC_ENABLE=1": {"THP_MEM_ALLOC_ENABLE": "1"},
}


def allocators_main(args) -> None:
    """The streamed pass alone under each glibc allocator setting (a fresh process each):
    its peak RSS above the resident model, and its user / system CPU time."""
    import os

    print(f"streamed pass (contribution + 3 baselines -> top-8, column sums; attention="
          f"{args.attention}), torch threads {torch.get_num_threads()}, one fresh process per cell")
    print(f"{'n':>6} {'allocator':<40} {'peak MB':>8} {'user s':>7} {'sys s':>6} {'wall s':>7}")
    md = ["| n | allocator | streamed peak (MB) | user CPU (s) | system CPU (s) | wall (s) |",
          "|---|---|---|---|---|---|"]
    compared = {k for extra in ALLOCATORS.values() for k in extra}
    base_env = {k: v for k, v in os.environ.items() if k not in compared}
    for n in args.lengths:
        for name, extra in ALLOCATORS.items():
            r = _sub(args, "--memory-row", str(n), "stream", env={**base_env, **extra})
            assert r is not None
            print(f"{n:>6} {name:<40} {r['peak_mb']:>8.0f} {r['user_s']:>7.1f} {r['sys_s']:>6.1f} "
                  f"{r['wall_s']:>7.1f}", flush=True)
            md.append(f"| {n} | `{name}` | {r['peak_mb']:.0f} | {r['user_s']:.1f} | {r['sys_s']:.1f} "
                      f"| {r['wall_s']:.1f} |")
    if args.docs:
        write_block(args.docs, "\n".join(md), args, marker=args.marker or "allocator-benchmark")


def one_row(model_name, device, n, repeats, dtype):
    import cwlens

    model = cwlens.load_model(model_name, device=device, dtype=dtype)
    base_rss = loaded_baseline_mb(model)
    torch.manual_seed(0)
    tokens = random_tokens(model, n, device)
    times = {"forward": [], "cwlens": [], "intra": []}
    with torch.no_grad():
        model(tokens)  # warm-up
        cwlens_pass(model, tokens)
        for _ in range(repeats):  # interleaved, so drift hits both alike
            for name, fn in (
                ("forward", lambda: model(tokens)),
                ("cwlens", lambda: cwlens_pass(model, tokens)),
                ("intra", lambda: cwlens_pass(model, tokens, intra=True)),
            ):
                if str(device).startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                times[name].append(time.perf_counter() - t0)
    fwd, cw = statistics.median(times["forward"]), statistics.median(times["cwlens"])
    both = statistics.median(times["intra"])
    if str(device).startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = peak_rss_mb() - base_rss
    return {"n": n, "forward_s": fwd, "cwlens_s": cw, "ratio": cw / fwd,
            "ratio_with_intra": both / fwd, "peak_extra_mb": peak}


def _memory_cap(args):
    """A row's address-space cap (CPU): an eager forward too big for this machine fails with
    an allocation error (its fields become null) instead of waking the kernel's OOM killer."""
    if str(args.device).startswith("cuda") or not args.memory_limit_gb:
        return None
    limit = int(args.memory_limit_gb * 2**30)
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _default_memory_limit_gb() -> float:
    import os

    return round(0.85 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)


def _sub(args, *extra, env=None, allow_failure=False) -> dict | None:
    cmd = [sys.executable, __file__, "--model", args.model, "--device", args.device,
           "--dtype", args.dtype, "--repeats", str(args.repeats), *extra]
    if args.random_config:
        cmd += ["--random-config", args.random_config]
    if args.query_block:
        cmd += ["--query-block", str(args.query_block)]
    cmd += ["--attention", args.attention]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                         preexec_fn=_memory_cap(args))
    if out.returncode != 0:
        if allow_failure:
            return None
        raise SystemExit(f"benchmark row failed ({' '.join(extra)}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _interleaved_cpu(runs: dict, repeats: int) -> tuple[dict, dict]:
    """Median CPU seconds of each of ``runs`` (name -> function), run in turn ``repeats``
    times after one warm-up round, and each function's last result."""
    times: dict = {name: [] for name in runs}
    last: dict = {}
    for _ in range(repeats + 1):  # the first round warms up
        for name, run in runs.items():
            t = time.process_time()
            last[name] = run()
            times[name].append(time.process_time() - t)
    return {name: statistics.median(v[1:]) for name, v in times.items()}, last


def choice_main(model_name, device, n_items, repeats):
    """CPU seconds of one multiple-choice batch of the faithfulness sweep (the clean pass
    and one masked pass: contribution, comprehensiveness, rate 0.5) with the full logits
    against the continuation positions only, interleaved; and the largest difference of
    their scores."""
    from dataclasses import replace

    import cwlens
    from cwlens.datasets import load_dataset
    from cwlens.faithfulness import FaithfulnessConfig
    from cwlens.faithfulness.passes import SweepStats, batch_outputs
    from cwlens.faithfulness.units import choice_units

    handle = cwlens.wrap(cwlens.load_model(model_name, device=device))
    units = choice_units(handle, load_dataset("capitals", n=n_items))
    cfg = FaithfulnessConfig(metrics=("contribution",), rates=(0.5,), modes=("comprehensiveness",))
    conditions = cfg.conditions(handle.n_layers)
    batch = list(range(len(units)))
    plain = [replace(u, positions=None) for u in units]
    runs = {"full logits": lambda: batch_outputs(handle, plain, batch, cfg, conditions, SweepStats()),
            "continuations": lambda: batch_outputs(handle, units, batch, cfg, conditions, SweepStats())}
    med, last = _interleaved_cpu(runs, repeats)
    diff = max(abs(a[k] - b[k]) for key in last["full logits"] for a, b in
               zip(last["full logits"][key], last["continuations"][key], strict=True)
               for k in ("gold_ll",))
    same_acc = all(a["acc"] == b["acc"] for key in last["full logits"] for a, b in
                   zip(last["full logits"][key], last["continuations"][key], strict=True))
    full, few = med["full logits"], med["continuations"]
    print(f"{model_name}: {n_items} capitals items x 4 choices, one batch (clean + 1 masked pass), "
          f"CPU time, median of {repeats} interleaved runs, torch threads {torch.get_num_threads()}")
    print(f"full logits {full:.2f} s, continuation positions only {few:.2f} s: "
          f"ratio {full / few:.2f}; max |gold_ll difference| {diff:.2e}, same acc: {same_acc}")


def topk_main(lengths, repeats, k=8):
    """CPU seconds of torch.topk and of the grouped top-k on one block, interleaved."""
    from cwlens.engine import row_topk

    print(f"top-{k} of a [1, 9, 256, n] block, CPU time, median of {repeats} interleaved runs; "
          f"TopK uses the grouped path from n = {row_topk.GROUPED_FROM}")
    print(f"{'n':>6} {'topk ms':>9} {'grouped ms':>11} {'topk/grouped':>13}")
    g = torch.Generator().manual_seed(0)
    for n in lengths:
        x = torch.rand(1, 9, 256, n, generator=g)
        runs = {"topk": lambda x=x: x.topk(k, dim=-1).indices,
                "grouped": lambda x=x: row_topk._grouped_topk_indices(x, k, row_topk.COLUMNS)}
        med, _ = _interleaved_cpu(runs, repeats)
        a, b = med["topk"], med["grouped"]
        print(f"{n:>6} {a * 1e3:>9.1f} {b * 1e3:>11.1f} {a / b:>13.2f}")


def sdpa_blocks_main(lengths, repeats, heads=9, kv_heads=3, d_head=64, batches=(1, 3)):
    """CPU seconds of one causal SDPA layer in capped and uncapped query blocks, interleaved."""
    from cwlens.engine.models.blockwise_math import Softmax, attend
    from cwlens.engine.streaming import auto_query_block

    print(f"one causal layer, SDPA per query block, [batch, {heads} heads ({kv_heads} kv), n, "
          f"{d_head}], CPU time, median of {repeats} interleaved runs (batch 3: a lockstep "
          "faithfulness pass of the clean copy and two masked ones)")
    print(f"{'n':>6} {'batch':>6} {'capped rows':>12} {'ms':>9} {'auto rows':>10} {'ms':>9} "
          f"{'capped/auto':>12}")
    g = torch.Generator().manual_seed(0)
    for n in lengths:
        for b in batches:
            q = torch.randn(b, heads, n, d_head, generator=g)
            k, v = (torch.randn(b, kv_heads, n, d_head, generator=g) for _ in range(2))
            rows = {"capped": auto_query_block(n, b * heads, "cpu"), "auto": auto_query_block(n)}
            med, outs = _interleaved_cpu(
                {name: functools.partial(attend, q, k, v, d_head ** -0.5, None, Softmax(causal=True, block=r))
                 for name, r in rows.items()}, repeats)
            torch.testing.assert_close(outs["capped"], outs["auto"], rtol=1e-5, atol=1e-5)
            a, c = med["capped"], med["auto"]
            print(f"{n:>6} {b:>6} {rows['capped']:>12} {a * 1e3:>9.1f} {rows['auto']:>10} "
                  f"{c * 1e3:>9.1f} {a / c:>12.2f}")


def _ranking_runs(scores, eligible, ties, fractions, full, partial):
    n = scores.shape[-1]
    runs = {"sort": lambda: full(scores, eligible, "row", ties)}
    for f in fractions:
        runs[f] = lambda f=f: partial(scores, eligible, ties, int(f * n + 0.5), 0)
    return runs


def ranking_main(lengths, repeats, heads=9):
    """CPU seconds of rank_entries and of rank_rows_partially on one sub-block, interleaved."""
    from cwlens.faithfulness.lockstep import RANK_ENTRIES
    from cwlens.faithfulness.partial_ranking import rank_rows_partially
    from cwlens.faithfulness.ranking import rank_entries

    fractions = (0.01, 0.1, 0.3)
    print(f"row ranking of {RANK_ENTRIES} entries ({heads} heads), CPU time, median of {repeats} "
          "interleaved runs: the full sort against the ends only, for comprehensiveness masks "
          "of a share of each row")
    print(f"{'n':>6} {'sort ms':>9} " + " ".join(f"{f'ends {f:.0%} ms':>13} {'ratio':>6}" for f in fractions))
    g = torch.Generator().manual_seed(0)
    for n in lengths:
        rows = max(1, RANK_ENTRIES // (heads * n))
        scores = torch.rand(1, heads, rows, n, generator=g)
        ties = torch.rand(1, heads, rows, n, generator=g)
        eligible = torch.ones(1, 1, rows, n, dtype=torch.bool)
        runs = _ranking_runs(scores, eligible, ties, fractions, rank_entries, rank_rows_partially)
        med, _ = _interleaved_cpu(runs, repeats)
        cells = " ".join(f"{med[f] * 1e3:>13.1f} {med['sort'] / med[f]:>6.2f}" for f in fractions)
        print(f"{n:>6} {med['sort'] * 1e3:>9.1f} {cells}")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--lengths", type=_positive, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--repeats", type=_positive, default=3)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--stream", action="store_true", help="time the streaming engine (see above)")
    ap.add_argument("--json", action="store_true", help="print one JSON line per n")
    ap.add_argument("--query-block", type=int, default=None, help="stream_reduce's query_block")
    ap.add_argument("--attention", default="auto", choices=["auto", "eager", "blockwise"],
                    help="--stream: stream_reduce's attention (blockwise: query blocks, no n x n "
                    "tensor; auto: blockwise above 2048 tokens)")
    ap.add_argument("--random-config", default=None,
                    help="a model shape with random weights instead of --model (e.g. llama-3.1-8b)")
    ap.add_argument("--docs", help="also write the table into this docs page (docs/benchmarks.md), "
                    "between <!-- benchmark:start --> and <!-- benchmark:end --> (--stream: "
                    "<!-- stream-benchmark:start --> ... end)")
    ap.add_argument("--marker", default=None, help="the page block's marker name (default: "
                    "benchmark, or stream-benchmark with --stream)")
    ap.add_argument("--memory-limit-gb", type=float, default=_default_memory_limit_gb(),
                    help="CPU: each row's address-space cap (default: 85%% of this machine's "
                    "memory); a forward that needs more is reported as not fitting (0: no cap)")
    mode.add_argument("--topk", action="store_true", help="time torch.topk against the grouped top-k")
    mode.add_argument("--choice", type=_positive, metavar="ITEMS",
                      help="time a multiple-choice batch of ITEMS capitals items: full logits "
                      "against the continuation positions only")
    mode.add_argument("--ranking", action="store_true", help="time the full row ranking against the ends-only one")
    mode.add_argument("--sdpa-blocks", action="store_true",
                      help="time an SDPA layer in CPU-capped against uncapped query blocks")
    mode.add_argument("--allocators", action="store_true",
                    help="the streamed pass's peak and CPU time under glibc's allocator settings")
    ap.add_argument("--no-eager", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--row", type=int, help=argparse.SUPPRESS)  # internal: one row, JSON out
    ap.add_argument("--stream-row", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--memory-row", nargs=2, help=argparse.SUPPRESS)  # n, forward|stream
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.row is not None:
        print(json.dumps(one_row(args.model, args.device, args.row, args.repeats, dtype)))
        return
    if args.stream_row is not None:
        print(json.dumps(stream_row(args.model, args.device, args.stream_row, args.repeats, dtype,
                                    args.random_config, args.query_block, args.attention,
                                    eager=not args.no_eager)))
        return
    if args.memory_row is not None:
        n, what = int(args.memory_row[0]), args.memory_row[1]
        print(json.dumps(memory_row(args.model, args.device, n, dtype, what, args.random_config,
                                    args.query_block, args.attention)))
        return
    if args.stream:
        return stream_main(args)
    if args.allocators:
        return allocators_main(args)
    if args.topk:
        return topk_main(args.lengths, args.repeats)
    if args.choice:
        return choice_main(args.model, args.device, args.choice, args.repeats)
    if args.ranking:
        return ranking_main(args.lengths, args.repeats)
    if args.sdpa_blocks:
        return sdpa_blocks_main(args.lengths, args.repeats)
    print(f"model {args.model}, device {args.device}, dtype {args.dtype}, torch threads {torch.get_num_threads()}")
    print(f"{'n':>6} {'forward s':>10} {'cwlens s':>10} {'ratio':>7} {'+intra':>7} {'peak extra MB':>14}")
    md = [
        "| n | forward (s) | cache + contribution + baselines (s) | ratio | ratio with intra too | peak extra memory (MB) |",
        "|---|---|---|---|---|---|",
    ]
    for n in args.lengths:
        r = _sub(args, "--row", str(n))
        print(
            f"{r['n']:>6} {r['forward_s']:>10.3f} {r['cwlens_s']:>10.3f} {r['ratio']:>7.2f} "
            f"{r['ratio_with_intra']:>7.2f} {r['peak_extra_mb']:>14.0f}"
        )
        md.append(
            f"| {r['n']} | {r['forward_s']:.3f} | {r['cwlens_s']:.3f} | {r['ratio']:.2f} | "
            f"{r['ratio_with_intra']:.2f} | {r['peak_extra_mb']:.0f} |"
        )
    if args.docs:
        write_block(args.docs, "\n".join(md), args, marker=args.marker or "benchmark")


def stream_main(args) -> None:
    import os

    env = dict(os.environ, **MMAP_ENV)  # memory rows: freed blocks leave the RSS
    if not args.json:
        print(f"model {args.random_config or args.model}, device {args.device}, dtype {args.dtype}, "
              f"torch threads {torch.get_num_threads()}; streamed = contribution + 3 baselines "
              "-> top-8 and column sums, every layer")
        print(f"{'n':>6} {'eager s':>9} {'blockw s':>9} {'alpha s':>9} {'stream s':>9} {'/eager':>7} "
              f"{'/blockw':>7} {'/alpha':>7} {'eager peak MB':>13} {'extra MB':>9} {'stream peak MB':>15}"
              f"   (attention={args.attention})")
    md = ["| n | eager forward (s) | blockwise forward (s) | blockwise forward reading α (s) "
          "| streamed (s) | streamed / eager | streamed / blockwise | streamed / reading α "
          "| eager forward peak (MB) | peak extra memory (MB) | streamed peak (MB) |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in args.lengths:
        # the eager forward's peak first, under a memory cap: where it cannot fit, its fields
        # are null and the timing row leaves it out (--memory-limit-gb)
        fwd_row = _sub(args, "--memory-row", str(n), "forward", env=env, allow_failure=True)
        # times under the allocator the benchmark was started with, except the longest CPU
        # rows, which also measure their peak in the same run (see ONE_RUN)
        long_row = one_run(n, args.device)
        r = _sub(args, "--stream-row", str(n), *([] if fwd_row else ["--no-eager"]),
                 env=env if long_row else None)
        assert r is not None
        r["timing_env"] = " ".join(f"{k}={v}" for k, v in MMAP_ENV.items()) if long_row else "as started"
        if "stream_peak_mb" in r:  # a one-shot long row measured it in the same run
            st_row = {"peak_mb": r.pop("stream_peak_mb")}
        else:
            st_row = _sub(args, "--memory-row", str(n), "stream", env=env)
        assert st_row is not None
        st = st_row["peak_mb"]
        fwd = None if fwd_row is None else fwd_row["peak_mb"]  # None: the eager forward did not fit
        r["forward_peak_mb"] = None if fwd is None else round(fwd, 1)
        r["peak_extra_mb"] = None if fwd is None else round(st - fwd, 1)
        r["stream_peak_mb"] = round(st, 1)
        def fmt(x, spec=".0f"):
            return "-" if x is None else format(x, spec)

        cells = [fmt(r.get("forward_s"), ".2f"), fmt(r.get("forward_blockwise_s"), ".2f"),
                 fmt(r.get("forward_alpha_s"), ".2f"), fmt(r["stream_s"], ".2f"),
                 fmt(r.get("ratio"), ".2f"), fmt(r.get("ratio_blockwise"), ".2f"),
                 fmt(r.get("ratio_alpha"), ".2f"), fmt(fwd), fmt(r["peak_extra_mb"]), fmt(st)]
        if args.json:
            keys = ("n", "forward_s", "stream_s", "ratio", "peak_extra_mb", "forward_peak_mb",
                    "attention", "stream_peak_mb", "forward_blockwise_s", "ratio_blockwise",
                    "forward_alpha_s", "ratio_alpha", "stream_sys_s", "timing_env")
            print(json.dumps({k: r.get(k) for k in keys}), flush=True)
        else:
            widths = (9, 9, 9, 9, 7, 7, 7, 13, 9, 15)
            print(f"{n:>6} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)),
                  flush=True)
        md.append(f"| {n} | " + " | ".join(cells) + " |")
    if args.docs:
        write_block(args.docs, "\n".join(md), args, marker=args.marker or "stream-benchmark")


def _one_run_note(args) -> str:
    """Where some rows of --stream ran once (CPU, above LONG tokens: stream_row), the
    block's header says which."""
    long = [n for n in getattr(args, "lengths", []) if n > LONG]
    if not args.stream or not long or str(args.device).startswith("cuda") or args.repeats == 1:
        return ""
    warmed = " (after a warm-up of the blockwise passes)" if any(n <= ONE_RUN for n in long) else ""
    return f"; the row{'s' if len(long) > 1 else ''} above {LONG} tokens ran once{warmed}"


def write_block(path, table: str, args, marker: str = "benchmark") -> None:
    import platform
    from pathlib import Path

    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    text = Path(path).read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} block")
    flags = " --stream --json" if args.stream else ""
    flags += f" --marker {args.marker}" if args.marker else ""
    flags += f" --repeats {args.repeats}" if args.repeats != 3 else ""
    for flag, value, default in (("--model", args.model, "smollm2-135m"), ("--device", args.device, "cpu"),
                                 ("--dtype", args.dtype, "float32"), ("--random-config", args.random_config, None),
                                 ("--query-block", args.query_block, None),
                                 ("--attention", getattr(args, "attention", "auto"), "auto")):
        flags += f" {flag} {value}" if value != default else ""
    cmd = f"python scripts/benchmark.py{flags} --lengths {' '.join(map(str, args.lengths))} --docs {path}"
    block = (
        f"{start}\nMeasured with `{cmd}` ({args.random_config or args.model}"
        f"{' (random weights)' if args.random_config else ''}, {args.device}, {args.dtype}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}; "
        f"median of {args.repeats} interleaved run{'s' if args.repeats > 1 else ''}"
        f"{_one_run_note(args)}):\n\n{table}\n{end}"
    )
    Path(path).write_text(text[: text.index(start)] + block + text[text.index(end) + len(end):], encoding="utf-8")


if __name__ == "__main__":
    main()
