#!/usr/bin/env python3
"""scenarios/decoder_failure.ron over seeds 1-10: TTFT before, during and
after the failure (the report's phases), retries, failures, expired leases,
stranded prefiller KV, and the accounting identity; medians (min-max).
Arguments go to `pdsim run` (e.g. --set transfer.lease.duration=480).
Run from the repository root after `cargo build --release`."""
import json, os, statistics, subprocess, sys, tempfile
extra = sys.argv[1:]
rows = []
tmp = tempfile.mkdtemp()
for seed in range(1, 11):
    out = os.path.join(tmp, f"seed{seed}.json")
    subprocess.run(["./target/release/pdsim", "run", "scenarios/decoder_failure.ron", "--seed", str(seed), "--json", out, *extra], check=True, stdout=subprocess.DEVNULL)
    r = json.load(open(out))
    c = r["counters"]
    ph = r["phases"]
    rows.append([ph[i]["observations"]["ttft"]["p99"] for i in range(3)] + [ph[i]["observations"]["ttft"]["mean"] for i in range(3)] +
                [c["client_retries"], c["requests_failed"], c["leases_expired"], c["stranded_kv_token_seconds"],
                 c["requests_arrived"] - c["requests_finished"] - c["requests_too_long"] - c["requests_failed"] - c["requests_in_flight"]])
names = ["TTFT p99 before", "during", "after", "TTFT mean before", "during", "after", "client retries", "failed", "leases expired", "stranded KV (token·s)", "unaccounted"]
for k, n in enumerate(names):
    v = [r[k] for r in rows]
    fmt = (lambda x: f"{x:.4f}") if isinstance(v[0], float) else (lambda x: f"{x}")
    print(f"{n:24s} median {fmt(statistics.median(v))}  ({fmt(min(v))}–{fmt(max(v))})")
