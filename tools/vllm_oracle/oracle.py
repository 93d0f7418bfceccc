#!/usr/bin/env python3
"""Drive vLLM's real v1 scheduler on an explicit request trace (the oracle).

    tools/vllm_oracle/.venv/bin/python tools/vllm_oracle/oracle.py TRACE.json [--json OUT]

Differential fuzzing against `pdsim replay` is fuzz.py, which imports this.

The scheduler, KV cache manager, block pool and (in P/D mode) the NIXL
connector's scheduler side are vLLM's own objects; only the model runner and
the connector's worker side are faked here, and simulated time follows
docs/model.md (docs/oracle.md lists every alignment decision).
"""

import argparse
import json
import os
import sys
import zlib

# Before vLLM is imported: no hub access, vLLM logs to stderr (stdout is the report).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model")
ENGINE_KEYS = ("block_size", "num_gpu_blocks", "max_num_batched_tokens",
               "max_num_seqs", "max_model_len", "c0", "a", "omega", "beta")


def token(stream, k):
    """Token at position k of a stream: a session's turns are prefixes of one
    stream, so a later prompt matches earlier prompt + output token for token."""
    return 1000 + zlib.crc32(f"{stream}:{k}".encode()) % 100000


class Engine:
    """One vLLM engine: a real Scheduler, a fake model runner, simulated time."""

    def __init__(self, name, cfg, kv_role=None, connector="NixlConnector"):
        self.name, self.cfg = name, cfg
        model = ModelConfig(model=MODEL_DIR, skip_tokenizer_init=True,
                            max_model_len=cfg["max_model_len"], dtype="bfloat16")
        sched = SchedulerConfig(
            max_model_len=cfg["max_model_len"], is_encoder_decoder=False,
            max_num_batched_tokens=cfg["max_num_batched_tokens"],
            max_num_seqs=cfg["max_num_seqs"], enable_chunked_prefill=True,
            async_scheduling=False)  # synchronous: one step in flight
        cache = CacheConfig(block_size=cfg["block_size"], enable_prefix_caching=True)
        kv_transfer = None
        if kv_role is not None:
            kv_transfer = KVTransferConfig(kv_connector=connector,
                                           kv_role=kv_role, engine_id=name)
        vllm_config = VllmConfig(model_config=model, scheduler_config=sched,
                                 cache_config=cache, device_config=DeviceConfig(device="cpu"),
                                 kv_transfer_config=kv_transfer)
        # What EngineCore._initialize_kv_caches would set after profiling.
        cache.num_gpu_blocks = cfg["num_gpu_blocks"]
        kv_cache_config = KVCacheConfig(
            num_blocks=cfg["num_gpu_blocks"], kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
                cfg["block_size"], num_kv_heads=1, head_size=1, dtype=torch.float32))])
        self.sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                               structured_output_manager=StructuredOutputManager(vllm_config),
                               block_size=cfg["block_size"])
        # As EngineCore.__init__: sha256 chained block hashes.
        hash_fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(cfg["block_size"], hash_fn)

        self.pending = []      # (arrival_time, Request) not yet given to the scheduler
        self.busy = None       # (SchedulerOutput, end_time) of the step in flight
        self.wake = True       # something happened: try to form a step
        # The fake worker's finished reads, in the order they finished (dicts
        # as ordered sets: a Python set would free two leases delivered
        # together in hash order, which varies from run to run).
        self.finished_recving, self.finished_sending = {}, {}
        self.streams, self.records, self.steps = {}, {}, []
        self.remote = {}       # req id -> read record (decoder, pd mode)
        self.pending_preempted = []

        # Observe (not change) what vLLM does: preemption order, and the
        # local hit the NIXL connector is asked about (the read is N - hit).
        self.preempt_log = []
        preempt = self.sched._preempt_request

        def logged_preempt(request, *args, **kwargs):
            self.preempt_log.append(request.request_id)
            return preempt(request, *args, **kwargs)
        self.sched._preempt_request = logged_preempt
        self.matched = {}
        if self.sched.connector is not None:
            match = self.sched.connector.get_num_new_matched_tokens

            def logged_match(request, num_computed_tokens):
                count, is_async = match(request, num_computed_tokens)
                self.matched[request.request_id] = (num_computed_tokens, count)
                return count, is_async
            self.sched.connector.get_num_new_matched_tokens = logged_match

    def submit(self, rid, stream, prompt_len, max_tokens, t, kv_transfer_params=None):
        if prompt_len >= self.cfg["max_model_len"]:
            # vLLM's input processor (`_validate_prompt_len`) refuses a prompt
            # that leaves no room for one output token: it never reaches the
            # scheduler.
            self.records[rid] = {"id": rid, "arrival_time": t, "first_scheduled_step": None,
                                 "prefix_hit": None, "first_token_step": None,
                                 "first_token_time": None, "finish_step": None,
                                 "finish_time": None, "preemptions": 0, "refused": True}
            return
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra)
        req = Request(rid, [token(stream, k) for k in range(prompt_len)], params, None,
                      arrival_time=t, block_hasher=self.hasher)
        self.streams[rid] = stream
        self.records[rid] = {"id": rid, "arrival_time": t, "first_scheduled_step": None,
                             "prefix_hit": None, "first_token_step": None,
                             "first_token_time": None, "finish_step": None,
                             "finish_time": None, "preemptions": 0}
        self.pending.append((t, req))
        self.pending.sort(key=lambda p: p[0])  # stable: trace order among equal times

    def next_event(self):
        if self.busy:
            return self.busy[1]
        return self.pending[0][0] if self.pending else None

    def _kv_output(self):
        """The fake connector worker's report: reads finished since the last one."""
        if not (self.finished_recving or self.finished_sending):
            return None
        # The scheduler only iterates these (Scheduler._update_from_kv_xfer_finished).
        out = KVConnectorOutput(finished_sending=list(self.finished_sending) or None,
                                finished_recving=list(self.finished_recving) or None)
        self.finished_recving, self.finished_sending = {}, {}
        return out

    def iterate(self, t, on_park):
        """Engine idle at t: form a step now if there is anything to schedule.

        Like EngineCore's busy loop, schedule() is called again at once after
        a call that scheduled nothing but changed something (delivered a
        finished transfer, preempted, parked): only a call that schedules
        tokens is a step and takes time."""
        self.wake = False
        preempted = self.pending_preempted
        while True:
            while self.pending and self.pending[0][0] <= t:
                self.sched.add_request(self.pending.pop(0)[1])
            self.preempt_log = []
            so = self.sched.schedule()
            parked = False
            for rid, req in self.sched.requests.items():
                if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and rid not in self.remote:
                    hit, count = self.matched[rid]
                    self.remote[rid] = {"parked_time": t, "local_hit": hit, "remote_tokens": count}
                    on_park(rid, t, count)
                    parked = True
            preempted = preempted + self.preempt_log
            if so.total_num_scheduled_tokens > 0:
                self.pending_preempted = []
                self._start_step(so, t, preempted)
                return
            # Zero tokens: not a step. The real engine still runs a no-forward
            # execute_model and update_from_output, which is where the worker's
            # finished_recving / finished_sending reach the scheduler.
            kv = self._kv_output()
            self.sched.update_from_output(so, ModelRunnerOutput(
                req_ids=[], req_id_to_index={}, kv_connector_output=kv))
            if kv is None and not self.preempt_log and not parked:
                # Idle until an arrival, a finished read or a lease end.
                self.pending_preempted = preempted
                return

    def _start_step(self, so, t, preempted):
        sched = self.sched
        kv = 0
        for rid, n in so.num_scheduled_tokens.items():
            req, rec = sched.requests[rid], self.records[rid]
            # num_computed_tokens already includes this step's tokens.
            kv += req.num_computed_tokens
            if rec["first_scheduled_step"] is None:
                rec["first_scheduled_step"] = len(self.steps)
                rec["prefix_hit"] = (self.remote[rid]["local_hit"] if rid in self.remote
                                     else req.num_computed_tokens - n)
        c = self.cfg
        tokens = so.total_num_scheduled_tokens
        cost = c["c0"] + max(c["omega"] + c["beta"] * kv, tokens * c["a"])
        pool = sched.kv_cache_manager.block_pool
        self.steps.append({
            "step": len(self.steps), "start": t, "end": t + cost,
            "scheduled": [[rid, n] for rid, n in so.num_scheduled_tokens.items()],
            "preempted": preempted,
            "kv_blocks_held": sum(1 for b in pool.blocks if b.ref_cnt > 0 and not b.is_null),
        })
        self.busy = (so, t + cost)

    def end_step(self, t, on_finish):
        """The step in flight ends at t: sample, then update_from_output."""
        so, _ = self.busy
        self.busy, self.wake = None, True
        step = len(self.steps) - 1
        # Preemptions so far, read before update_from_output drops the
        # requests that finish now (one preempted by the formation of its
        # last step would otherwise keep its older count).
        self._note_preemptions()
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.sched.requests[rid]
            # A token is sampled only when all known tokens are computed (not
            # after a partial prefill chunk): the next token of the stream.
            done = req.num_computed_tokens >= req.num_tokens
            sampled.append([token(self.streams[rid], req.num_tokens)] if done else [])
        outputs = self.sched.update_from_output(so, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled, kv_connector_output=self._kv_output()))
        for eco in outputs.values():
            for out in eco.outputs:
                rec = self.records[out.request_id]
                if out.new_token_ids and rec["first_token_step"] is None:
                    rec["first_token_step"], rec["first_token_time"] = step, t
                if out.finish_reason is not None:
                    rec["finish_step"], rec["finish_time"] = step, t
                    on_finish(out.request_id, t, out.kv_transfer_params)
        self._note_preemptions()

    def _note_preemptions(self):
        for rid, rec in self.records.items():
            req = self.sched.requests.get(rid)
            if req is not None:
                rec["preemptions"] = req.num_preemptions

    def report(self, extra=None):
        reqs = []
        for rid, rec in self.records.items():
            rec = dict(rec)
            if extra:
                rec.update(extra.get(rid, {}))
            reqs.append(rec)
        return {"requests": reqs, "steps": self.steps}


class Reads:
    """NIXL pull reads between one prefiller and one decoder: each read starts
    x0 after parking, then all flows share the NIC rate equally (processor
    sharing; on one P-D pair this is what max-min fairness gives).

    Flows are brought up to date, and their finish times recomputed, only when
    the set of flows changes (a read starts or ends), with the same arithmetic
    as pdsim (ecs/transfer/systems.rs): remaining -= rate * elapsed (not below 0),
    finish = now + remaining / rate. Updating at every event instead gives the
    same times up to float rounding, which is enough to order a read's end and
    a step's end that coincide differently on the two sides."""

    def __init__(self, x0, rate):
        self.x0, self.rate = x0, rate
        self.starting = []   # (start_time, rid, tokens)
        self.flows = {}      # rid -> [remaining, finish_time], in start order
        self.last = 0.0
        self.log = {}        # rid -> {"read_start", "read_done"}

    def park(self, rid, t, tokens):
        self.starting.append((t + self.x0, rid, tokens))


    def next_event(self):
        times = [s[0] for s in self.starting] + [f[1] for f in self.flows.values()]
        return min(times) if times else None

    def advance(self, t):
        """Returns the ids whose read completed at t."""
        done = [rid for rid, f in self.flows.items() if f[1] <= t]
        starting = [s for s in self.starting if s[0] <= t]
        if not done and not starting:
            return []
        share = self.rate / len(self.flows) if self.flows else 0.0
        for f in self.flows.values():
            f[0] = max(f[0] - share * (t - self.last), 0.0)
        self.last = t
        for rid in done:
            del self.flows[rid]
            self.log[rid]["read_done"] = t
        for s in starting:
            self.starting.remove(s)
            self.flows[s[1]] = [float(s[2]), None]
            self.log[s[1]] = {"read_start": t}
        if self.flows:
            share = self.rate / len(self.flows)
            for f in self.flows.values():
                f[1] = t + f[0] / share
        return done


class Writes(Reads):
    """NIXL push (NixlPushConnector): the decoder registers its blocks at
    parking, and the registration reaches the prefiller's writer `notify`
    later; the prefiller's finished blocks reach it at the prefill's end
    (its next schedule(), at once here). The WRITE is posted x0 after the
    later of the two and shares the NICs as a read does; its end is
    reported by both fake workers, as a read's is. Leases never expire here
    (the oracle drives no lease reaper)."""

    def __init__(self, x0, rate, notify):
        super().__init__(x0, rate)
        self.notify = notify
        self.registered = {}   # rid -> (time the registration reaches P, tokens)
        self.prefilled = {}    # rid -> time P's blocks are ready

    def park(self, rid, t, tokens):
        self.registered[rid] = (t + self.notify, tokens)
        self._try(rid)

    def prefill_done(self, rid, t):
        self.prefilled[rid] = t
        self._try(rid)

    def _try(self, rid):
        if rid in self.registered and rid in self.prefilled:
            reg, tokens = self.registered.pop(rid)
            self.starting.append((max(reg, self.prefilled.pop(rid)) + self.x0, rid, tokens))


def engine_cfg(config, role):
    cfg = {k: config[k] for k in ENGINE_KEYS}
    cfg.update(config.get(role, {}) if role else {})
    return cfg


def run(trace):
    config, requests = trace["config"], trace["requests"]
    mode = config["mode"]
    if mode == "single":
        engines = [Engine("engine", engine_cfg(config, None))]
        for r in requests:
            engines[0].submit(r["id"], r.get("session") or r["id"], r["prompt_len"],
                              r["output_len"], r["arrival_time"])
        reads = None
    elif mode == "pd":
        push = config.get("transfer", "pull") == "push"
        parallel = config.get("dispatch", "serial") == "parallel"
        if parallel and not push:
            raise SystemExit("parallel dispatch needs the push connector")
        connector = "NixlPushConnector" if push else "NixlConnector"
        P = Engine("prefill", engine_cfg(config, "prefill"), "kv_producer", connector)
        D = Engine("decode", engine_cfg(config, "decode"), "kv_consumer", connector)
        engines = [P, D]
        if push:
            reads = Writes(config["x0"], config["nic_tokens_per_s"],
                           config.get("notify_latency", 0.001))
        else:
            reads = Reads(config["x0"], config["nic_tokens_per_s"])
        by_id = {r["id"]: r for r in requests}
        for r in requests:
            # The prefill leg: max_tokens = 1, do_remote_decode.
            P.submit(r["id"], r.get("session") or r["id"], r["prompt_len"], 1,
                     r["arrival_time"], {"do_remote_decode": True})
            if r["prompt_len"] >= D.cfg["max_model_len"] and not parallel:
                # Refused by the prefiller: the sidecar answers the client
                # with the error; the decoder never sees it (listed refused).
                D.submit(r["id"], r["id"], r["prompt_len"], r["output_len"], r["arrival_time"])
            if parallel:
                # vLLM's push proxy sends the decode leg at the same time,
                # naming the prefiller from its command line (no block ids).
                D.submit(r["id"], r.get("session") or r["id"], r["prompt_len"],
                         r["output_len"], r["arrival_time"], {
                             "do_remote_decode": False, "do_remote_prefill": True,
                             "remote_engine_id": "prefill", "remote_host": "localhost",
                             "remote_port": 5600, "tp_size": 1, "pp_size": 1,
                             "remote_request_id": r["id"]})
    else:
        raise SystemExit(f"unknown mode {mode!r}")

    def on_finish(engine, rid, t, kv_params):
        if reads is None or engine is not engines[0]:
            return
        if isinstance(reads, Writes):
            reads.prefill_done(rid, t)
        if config.get("dispatch", "serial") == "serial":
            # The sidecar's decode leg: the original request, carrying the
            # prefiller's kv_transfer_params, reaches the decoder at t.
            r = by_id[rid]
            engines[1].submit(rid, r.get("session") or rid, r["prompt_len"],
                              r["output_len"], t, kv_params)
            engines[1].wake = True

    def on_park(rid, t, tokens):
        reads.park(rid, t, tokens)

    t = 0.0
    while True:
        times = [e.next_event() for e in engines]
        if reads is not None:
            times.append(reads.next_event())
        times = [x for x in times if x is not None]
        if not times:
            break
        t = max(t, min(times))
        # 1. Transfers: a finished read is reported by both fake workers at
        #    the first update_from_output at or after t.
        if reads is not None:
            for rid in reads.advance(t):
                engines[1].finished_recving[rid] = None
                engines[0].finished_sending[rid] = None
                engines[0].wake = engines[1].wake = True
        # 2. Steps that end now (prefiller first, so that a decode leg it
        #    releases at t is visible to the decoder's step formed at t).
        for e in engines:
            if e.busy and e.busy[1] <= t:
                e.end_step(t, lambda rid, tt, kv, e=e: on_finish(e, rid, tt, kv))
        # 3. Idle engines with news form their next step now.
        for e in engines:
            if e.busy is None and (e.wake or (e.pending and e.pending[0][0] <= t)):
                e.iterate(t, on_park)

    for e in engines:
        left = [rid for rid, rec in e.records.items()
                if rec["finish_time"] is None and not rec.get("refused")]
        if left:
            raise SystemExit(f"{e.name}: requests never finished (stuck): {left}")
    if mode == "single":
        return {"mode": "single", **engines[0].report()}
    extra = {rid: {**{k: v for k, v in info.items() if k != "local_hit"}, **reads.log[rid]}
             for rid, info in engines[1].remote.items()}
    return {"mode": "pd", "prefill": engines[0].report(), "decode": engines[1].report(extra)}


def rounded(x):
    """Times are printed rounded to 1e-12 s (float noise); compare with a tolerance."""
    if isinstance(x, float):
        return round(x, 12)
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return x


def dumps(report):
    """JSON with one line per request and per step, so that diffs read well."""
    def section(sec, indent):
        pad = " " * indent
        lines = []
        for key in ("requests", "steps"):
            rows = (",\n" + pad + "  ").join(json.dumps(rounded(x)) for x in sec[key])
            lines.append(f'{pad}"{key}": [\n{pad}  {rows}\n{pad}]')
        return ",\n".join(lines)
    if report["mode"] == "single":
        body = section(report, 1)
    else:
        body = ",\n".join(f' "{role}": {{\n{section(report[role], 2)}\n }}'
                           for role in ("prefill", "decode"))
    return f'{{\n "mode": "{report["mode"]}",\n{body}\n}}\n'


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?")
    ap.add_argument("--json", help="write the report here (default: stdout)")
    args = ap.parse_args()
    if args.trace is None:
        ap.error("a trace is required (differential fuzzing is fuzz.py)")
    with open(args.trace) as f:
        report = run(json.load(f))
    text = dumps(report)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
