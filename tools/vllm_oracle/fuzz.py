#!/usr/bin/env python3
"""Differential fuzzer: random traces through vLLM's scheduler (the oracle, in
this process) and `pdsim replay` (the release binary), compared step by step.

    cargo build --release
    tools/vllm_oracle/.venv/bin/python tools/vllm_oracle/fuzz.py --fuzz 200 --seed 1

Each trace is small and random: single engine or P/D, block sizes, pool sizes
(from one max_model_len request up to ample), budgets, slots, step costs,
NIC rates and read latencies, 1-16 requests, some in multi-turn sessions whose
later prompts extend earlier prompt + output; a third of the traces are tight
(small pools and budgets, bursts of long requests: preemptions, chunked
recomputation, parking beside it). Trace k of seed S is a function
of (S, k) only. The first divergence stops the run: the trace is written to
fuzz-divergence-S-K.json (replay it with oracle.py and `pdsim replay`) and
both schedules are printed around the first step that differs. Exit status:
0 when every trace agreed, 1 at a divergence.

Agreement means what tests/integration/golden.rs requires of the golden
traces: identical steps (scheduled lists, preempted lists, blocks held) and
request rows (steps, prefix hits, preemptions, reads), times within 1e-9 s.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

TOL = 1e-9


def random_engine(rng, bs, mml, tight):
    """Engine keys; the pool holds at least one max_model_len request beside
    vLLM's null block, so no request can wait forever. Tight engines have
    small pools and budgets (preemptions, chunked recomputation)."""
    slots = rng.choice([1, 1, 2, 3, 4, 6])
    budget = rng.choice([2, 4, 8, 12, 16] if tight else [4, 8, 16, 24, 32, 64, 128])
    least = -(-mml // bs) + 1
    extra = rng.choice([0, 1, 2, 3] if tight else [0, 0, 1, 2, 3, 5, 8, 16, 64])
    return {
        "block_size": bs,
        "num_gpu_blocks": least + extra,
        "max_num_batched_tokens": max(slots, budget),
        "max_num_seqs": slots,
        "max_model_len": mml,
        "c0": rng.choice([0.0, 0.0, 0.0005]),
        "a": rng.choice([0.001, 0.0005, 0.002]),
        "omega": rng.choice([0.001, 0.002, 0.004]),
        "beta": rng.choice([0.0, 0.0, 1e-5]),
    }


def random_trace(rng):
    """A random trace. A third are "tight": small pools and budgets, more and
    longer requests arriving in bursts."""
    mode = rng.choice(["single", "pd"])
    tight = rng.random() < 1 / 3
    bs = rng.choice([2, 4, 4, 8, 16])
    mml = rng.choice([32, 48, 64, 96, 128])
    mml = max(mml, 2 * bs)
    base = random_engine(rng, bs, mml, tight)
    config = {"mode": mode, **base}
    if mode == "pd":
        config["x0"] = rng.choice([0.0, 0.001, 0.002, 0.005])
        config["nic_tokens_per_s"] = rng.choice([500, 1000, 2000, 10000])
        for role in ("prefill", "decode"):
            other = random_engine(rng, bs, mml, tight)
            keys = [k for k in other if k not in ("block_size", "max_model_len")]
            over = {k: other[k] for k in rng.sample(keys, rng.randint(0, len(keys)))}
            eff = {**base, **over}
            if eff["max_num_batched_tokens"] < eff["max_num_seqs"]:  # vLLM refuses it
                over["max_num_batched_tokens"] = eff["max_num_seqs"]
            config[role] = over
    n = rng.randint(4, 16) if tight else rng.randint(1, 10)
    horizon = rng.choice([0.0, 0.02, 0.1, 0.3])
    context = {}  # session -> tokens so far (prompt + output of its last turn)
    requests = []
    for i in range(n):
        session = rng.choice([None, None, "s0", "s1", "s2"])
        k = context.get(session, 0) if session else 0
        if session and k and k < mml - 1 and rng.random() < 0.7:
            prompt = min(mml - 1, k + rng.randint(1, 24))  # a later turn
        elif tight:
            prompt = rng.randint(mml // 4, mml - 1)
        else:
            prompt = rng.randint(1, mml - 1)
        output = rng.randint(1, min(40 if tight else 24, mml - prompt))
        r = rng.random()
        if r < 0.04:
            prompt = rng.randint(mml, mml + 16)  # refused: reaches max_model_len
        elif r < 0.12:
            output = rng.randint(1, 40)  # may run past max_model_len: capped
        if session:
            context[session] = prompt + output
        arrival = round(rng.uniform(0, horizon), 3) if rng.random() < 0.8 else 0.0
        requests.append({"id": f"r{i}", "arrival_time": arrival, "prompt_len": prompt,
                         "session": session, "output_len": output})
    if mode == "pd" and rng.random() < 0.5:
        # NIXL push (drawn last: the pull traces of a seed stay as they were).
        config["transfer"] = "push"
        config["dispatch"] = rng.choice(["serial", "parallel"])
        config["notify_latency"] = rng.choice([0.0, 0.001, 0.003])
    return {"config": config, "requests": requests}


def kind(trace):
    """single, pd (pull), pd push serial, pd push parallel."""
    c = trace["config"]
    if c.get("transfer") == "push":
        return f"pd push {c['dispatch']}"
    return c["mode"]


def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) <= TOL
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def sections(report):
    if report["mode"] == "pd":
        return [("prefill", report["prefill"]), ("decode", report["decode"])]
    return [("engine", report)]


def divergence(ours, theirs):
    """The first difference: (section, step index or None, message), or None."""
    if ours["mode"] != theirs["mode"]:
        return ("-", None, f"mode {ours['mode']} vs {theirs['mode']}")
    for (name, a), (_, b) in zip(sections(ours), sections(theirs)):
        for i, (x, y) in enumerate(zip(a["steps"], b["steps"])):
            for key in ("start", "end", "scheduled", "preempted", "kv_blocks_held"):
                if not same(x[key], y[key]):
                    return (name, i, f"step {i} {key}: pdsim {x[key]} vs vLLM {y[key]}")
        if len(a["steps"]) != len(b["steps"]):
            i = min(len(a["steps"]), len(b["steps"]))
            return (name, i, f"{len(a['steps'])} steps in pdsim vs {len(b['steps'])} in vLLM")
        ra = {r["id"]: r for r in a["requests"]}
        for y in b["requests"]:
            x = ra.get(y["id"])
            if x is None:
                return (name, None, f"request {y['id']} missing in pdsim")
            for key in y:
                if not same(x.get(key), y[key]):
                    step = y.get("first_scheduled_step")
                    return (name, step, f"request {y['id']} {key}: pdsim {x.get(key)} vs vLLM {y[key]}")
        if len(ra) != len(b["requests"]):
            return (name, None, "pdsim reports requests vLLM does not")
    return None


def show(where, ours, theirs, around=3):
    name, step, msg = where
    print(f"first divergence ({name}): {msg}")
    for label, report in (("pdsim", ours), ("vLLM", theirs)):
        sec = dict(sections(report)).get(name)
        if sec is None:
            continue
        steps = sec["steps"]
        lo = 0 if step is None else max(0, step - around)
        hi = len(steps) if step is None else min(len(steps), step + around + 1)
        print(f"  {label} {name} steps {lo}..{hi - 1}:")
        for s in steps[lo:hi]:
            mark = ">" if s["step"] == step else " "
            print(f"   {mark} {json.dumps(s)}")
        for r in sec["requests"]:
            print(f"     {json.dumps(r)}")


def features(report):
    """What a trace exercised (for the summary: the fuzzer's coverage)."""
    out = set()
    for name, sec in sections(report):
        if any(s["preempted"] for s in sec["steps"]):
            out.add(f"{name} preemptions")
        if any(r["prefix_hit"] for r in sec["requests"] if "parked_time" not in r):
            out.add(f"{name} prefix hits")
        if any(len(s["scheduled"]) > 1 and any(n > 1 for _, n in s["scheduled"])
               for s in sec["steps"]):
            out.add(f"{name} mixed prefill+decode steps")
        remote = [r for r in sec["requests"] if "parked_time" in r]
        if any(r["prefix_hit"] for r in remote):
            out.add("decoder local hits")
        if any(r["parked_time"] > r["arrival_time"] for r in remote):
            out.add("parking delayed")
        if any(r["first_scheduled_step"] is not None and r["read_done"] is not None
               and sec["steps"][r["first_scheduled_step"]]["start"] > r["read_done"]
               for r in remote):
            out.add("promotion delayed")
    return sorted(out)


def run_pdsim(binary, trace, tmp):
    path = os.path.join(tmp, "trace.json")
    out = os.path.join(tmp, "pdsim.json")
    with open(path, "w") as f:
        json.dump(trace, f)
    subprocess.run([binary, "replay", path, "--json", out], check=True)
    with open(out) as f:
        return json.load(f)


def fuzz(n, seed, binary=None, quiet=False, start=0):
    import oracle  # imports vLLM once, for every trace
    binary = binary or os.path.join(ROOT, "target", "release", "pdsim")
    if not os.path.exists(binary):
        raise SystemExit(f"{binary} not found: run `cargo build --release` first")
    counts = {"single": 0, "pd": 0, "pd push serial": 0, "pd push parallel": 0}
    seen = {}
    steps = 0
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(start, start + n):
            rng = random.Random(f"{seed}:{k}")
            trace = random_trace(rng)
            try:
                theirs = json.loads(oracle.dumps(oracle.run(trace)))  # rounded as the golden files
            except SystemExit as e:  # the oracle found requests that never finish
                path = f"fuzz-stuck-{seed}-{k}.json"
                with open(path, "w") as f:
                    json.dump(trace, f, indent=1)
                print(f"trace {k} (seed {seed}): vLLM run did not complete ({e}); written to {path}")
                return 2
            ours = run_pdsim(binary, trace, tmp)
            where = divergence(ours, theirs)
            if where is not None:
                path = f"fuzz-divergence-{seed}-{k}.json"
                with open(path, "w") as f:
                    json.dump(trace, f, indent=1)
                print(f"trace {k} (seed {seed}, {kind(trace)}) diverges; written to {path}")
                show(where, ours, theirs)
                return 1
            counts[kind(trace)] += 1
            steps += sum(len(s["steps"]) for _, s in sections(theirs))
            for feature in features(theirs):
                seen[feature] = seen.get(feature, 0) + 1
            if not quiet and (k + 1) % 25 == 0:
                print(f"{k + 1} traces agree ({time.time() - started:.0f} s)", file=sys.stderr)
    print(f"{n} random traces (seed {seed}): {counts['single']} single-engine, {counts['pd']} P/D pull, "
          f"{counts['pd push serial']} P/D push serial, {counts['pd push parallel']} P/D push parallel, "
          f"{steps} vLLM steps; 0 divergences ({time.time() - started:.0f} s)")
    print("traces showing: " + ", ".join(f"{k} {v}" for k, v in sorted(seen.items())))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuzz", type=int, required=True, metavar="N", help="number of random traces")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, metavar="K",
                    help="begin with trace K of the seed (to rerun one that diverged)")
    ap.add_argument("--pdsim", help="the pdsim binary (default: target/release/pdsim)")
    args = ap.parse_args()
    sys.exit(fuzz(args.fuzz, args.seed, args.pdsim, start=args.start))


if __name__ == "__main__":
    main()
