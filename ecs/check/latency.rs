//! `vllm bench latency` on one simulated engine: a batch of requests of
//! `input_len` prompt tokens and `output_len` output tokens, all arriving
//! at once, scheduled by the pool's engine (chunked prefill, then decode
//! steps) under its step-time model. A user who runs the same command on
//! their GPUs compares the end-to-end time directly.

use bevy_ecs::prelude::*;
use serde::Serialize;

use crate::engine::cost::StepTime;
use crate::engine::{BlockPath, BlockPool, Engine, Request, Role, Status, StepLog};
use crate::error::{Error, Result};
use crate::scenario::{EngineSemantics, Pool, PoolPlan};

/// `--latency BATCH:INPUT:OUTPUT`, as `vllm bench latency --batch-size
/// --input-len --output-len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LatencyArgs {
    pub batch_size: u32,
    pub input_len: u32,
    pub output_len: u32,
}

impl std::str::FromStr for LatencyArgs {
    type Err = Error;
    fn from_str(s: &str) -> Result<LatencyArgs> {
        let parts: Vec<Option<u32>> = s.split(':').map(|p| p.trim().parse().ok()).collect();
        match parts[..] {
            [Some(b), Some(i), Some(o)] if b > 0 && i > 0 && o > 0 => Ok(LatencyArgs {
                batch_size: b,
                input_len: i,
                output_len: o,
            }),
            _ => Err(Error::new(format!(
                "--latency {s}: expected BATCH:INPUT:OUTPUT, three whole numbers above 0, e.g. 8:32:128"
            ))),
        }
    }
}

/// The simulated run of one batch.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub batch_size: u32,
    pub input_len: u32,
    pub output_len: u32,
    /// Seconds until the last request's last token.
    pub e2e: f64,
    /// Seconds until the last request's first token.
    pub first_token: f64,
    pub steps: u64,
    /// Mean step after every request had its first token.
    pub mean_decode_step: f64,
    /// Whether the batch could not be served (the KV pool is too small to
    /// hold one request, or the run did not finish).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// Runs the batch through one engine of `pool` (docs/model.md semantics, no
/// prefix sharing: every prompt is distinct, as vLLM's dummy prompts are).
pub fn run(pool: &Pool, plan: &PoolPlan, args: LatencyArgs) -> Latency {
    let mut world = World::new();
    let mut engine = Engine::new(
        Role::Decode,
        0,
        pool.engine.clone(),
        StepTime::of_plan(plan),
    );
    let mut kv = BlockPool::for_engine(
        plan.num_gpu_blocks,
        pool.engine.block_size,
        EngineSemantics::Reference,
    );
    let ids: Vec<Entity> = (0..args.batch_size)
        .map(|i| {
            let r = Request::new(
                u64::from(i),
                u64::from(i),
                BlockPath::stream(u64::from(i)),
                args.input_len,
                args.output_len,
                0.0,
            );
            world.spawn(r).id()
        })
        .collect();
    for &id in &ids {
        engine.enqueue(id);
    }
    let mut state = world.query::<&mut Request>();
    let mut reqs = state.query_mut(&mut world);
    let mut log = StepLog::default();
    let (mut now, mut first_token, mut after_first) = (0.0, None, (0.0, 0u64));
    let mut problem = None;
    // Enough steps for every token of every request, with room for preemptions.
    let limit = 4 * u64::from(args.batch_size) * u64::from(args.input_len + args.output_len) + 64;
    while engine.steps < limit {
        log.clear();
        let Some(end) = engine.start_step(now, &mut kv, &mut reqs, &mut log) else {
            problem = Some(
                "the engine cannot schedule the batch (its KV pool cannot hold one request)".into(),
            );
            break;
        };
        let repeat = engine.repeat;
        log.clear();
        engine.finish_step(end, &mut kv, &mut reqs, &mut log);
        if first_token.is_some() {
            after_first.0 += end - now;
            after_first.1 += u64::from(repeat);
        }
        now = end;
        let started = ids.iter().all(|&id| {
            reqs.get(id)
                .is_ok_and(|r| r.generated > 0 || r.status == Status::Finished)
        });
        if first_token.is_none() && started {
            first_token = Some(now);
        }
        if ids
            .iter()
            .all(|&id| reqs.get(id).is_ok_and(|r| r.status == Status::Finished))
        {
            break;
        }
    }
    if problem.is_none()
        && !ids
            .iter()
            .all(|&id| reqs.get(id).is_ok_and(|r| r.status == Status::Finished))
    {
        problem = Some(format!("the batch did not finish within {limit} steps"));
    }
    Latency {
        batch_size: args.batch_size,
        input_len: args.input_len,
        output_len: args.output_len,
        e2e: now,
        first_token: first_token.unwrap_or(f64::NAN),
        steps: engine.steps,
        mean_decode_step: if after_first.1 > 0 {
            after_first.0 / after_first.1 as f64
        } else {
            0.0
        },
        problem,
    }
}
