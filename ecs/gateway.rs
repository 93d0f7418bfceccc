//! The gateway (MODEL.md §4): the llm-d router (decode profile → decider →
//! prefill profile, all rhai scripts) and the routing sidecar's serial
//! dispatch (prefill leg, wait for its answer, decode leg `from P[i]`).

use bevy_ecs::prelude::*;

use crate::engine::{Engine, KvPool, Nic};
use crate::error::Error;
use crate::kv::reusable;
use crate::policy::{PodView, Policies, ReqView, Role};
use crate::request::{KvSource, Leg, Request, Status};
use crate::router_book::RouterBook;
use crate::scenario::TransferMode;
use crate::sim::{Clock, EngineIndex, Gateway, Handoffs, RunStatus};
use crate::transfer::{Flows, Lease, start_copy};

/// How requests are routed.
pub enum RouterMode {
    /// The scenario's scripts decide (the normal case).
    Scripts(Box<Policies>),
    /// No router: every request goes to decoder 0, prefilled on prefiller 0
    /// when its trace entry says `remote` (replays of one engine or one P/D
    /// pair, mechanism tests).
    Direct,
}

/// The router: its policies and its own bookkeeping. A non-send resource
/// (`NonSendMut<Router>` in systems): the rhai engine is built without its
/// `sync` feature, which makes every script call cheaper, and a run never
/// leaves the thread that built it.
pub struct Router {
    pub mode: RouterMode,
    pub book: RouterBook,
    /// Requests routed and wall seconds spent deciding (for benchmarks).
    pub decisions: u64,
    pub seconds: f64,
    /// Scratch candidate views, reused across requests.
    pods: Vec<PodView>,
}

impl Router {
    pub fn new(mode: RouterMode, book: RouterBook) -> Router {
        Router {
            mode,
            book,
            decisions: 0,
            seconds: 0.0,
            pods: Vec::new(),
        }
    }
}

pub fn req_view(r: &Request, block_size: u32) -> ReqView {
    ReqView {
        id: r.id as i64,
        session: r.stream as i64,
        turn: r.turn as i64,
        prompt_tokens: r.prompt as i64,
        new_tokens: r.new_tokens as i64,
        block_size: block_size as i64,
    }
}

/// What a policy sees of instance `e` while routing request `r`.
fn pod_view(
    e: Entity,
    r: &Request,
    engines: &Query<(&mut Engine, &KvPool, &Nic)>,
    flows: &Flows,
    book: &RouterBook,
) -> PodView {
    let (eng, kv, nic) = engines.get(e).expect("engine");
    let kv = &kv.0;
    let bs = kv.block_size();
    let cached_blocks = kv.cached_prefix_blocks(r.stream, reusable(r.prompt, bs) / bs);
    let (router_requests, router_tokens) = book.in_flight(eng.role, eng.index);
    PodView {
        role: book.role_name(eng.role),
        index: eng.index as i64,
        active: eng.active() as i64,
        running: eng.running.len() as i64,
        queued: eng.waiting.len() as i64,
        parked: eng.parked as i64,
        prompt_backlog: eng.prompt_backlog() as i64,
        kv_capacity: (kv.num_blocks() * bs) as i64,
        kv_held: (kv.num_held() * bs) as i64,
        kv_free_cached: (kv.num_free_cached() * bs) as i64,
        cached_tokens: (cached_blocks * bs) as i64,
        max_num_seqs: eng.cfg.max_num_seqs as i64,
        nic_flows: flows.per_link[nic.link as usize] as i64,
        router_requests: router_requests as i64,
        router_tokens: router_tokens as i64,
        router_cached_tokens: book.cached_tokens(
            eng.role,
            eng.index,
            r.stream,
            reusable(r.prompt, bs),
            bs,
        ) as i64,
    }
}

/// System: route every request that reached the gateway this tick.
#[allow(clippy::too_many_arguments)]
pub fn routing_system(
    mut gateway: ResMut<Gateway>,
    mut router: NonSendMut<Router>,
    index: Res<EngineIndex>,
    mut engines: Query<(&mut Engine, &KvPool, &Nic)>,
    mut reqs: Query<&mut Request>,
    flows: Res<Flows>,
    mut status: ResMut<RunStatus>,
) {
    if gateway.queue.is_empty() || status.error.is_some() {
        return;
    }
    let router = &mut *router;
    for i in 0..gateway.queue.len() {
        let id = gateway.queue[i];
        let started = std::time::Instant::now();
        let decision = route(id, router, &index, &engines, &reqs, &flows);
        router.decisions += 1;
        router.seconds += started.elapsed().as_secs_f64();
        match decision {
            Ok((decoder, prefiller)) => {
                let mut r = reqs.get_mut(id).expect("routed request");
                tracing::debug!(
                    request = r.id,
                    session = r.stream,
                    prompt = r.prompt,
                    remote = prefiller.is_some(),
                    "routed"
                );
                r.decoder = Some(decoder);
                r.prefiller = prefiller;
                let target = match prefiller {
                    Some(p) => {
                        r.leg = Leg::Prefill;
                        p
                    }
                    None => decoder,
                };
                let prompt = r.prompt;
                let stream = r.stream;
                let (d, _, _) = engines.get(decoder).expect("decoder");
                let d_index = d.index;
                router.book.routed(
                    d_index,
                    prefiller.map(|p| engines.get(p).expect("prefiller").0.index),
                    prompt,
                    stream,
                );
                engines.get_mut(target).expect("engine").0.enqueue(id);
            }
            Err(e) => {
                status.error = Some(e);
                break;
            }
        }
    }
    gateway.queue.clear();
}

/// The llm-d disaggregation profile handler: decode profile, decider, then
/// the prefill profile when the decider says so.
fn route(
    id: Entity,
    router: &mut Router,
    index: &EngineIndex,
    engines: &Query<(&mut Engine, &KvPool, &Nic)>,
    reqs: &Query<&mut Request>,
    flows: &Flows,
) -> Result<(Entity, Option<Entity>), Error> {
    let r = reqs.get(id).expect("request at the gateway");
    let policies = match &mut router.mode {
        RouterMode::Direct => {
            return Ok((index.decode[0], r.trace_remote.then(|| index.prefill[0])));
        }
        RouterMode::Scripts(p) => p,
    };
    let bs = engines
        .get(index.decode[0])
        .expect("decoder")
        .1
        .0
        .block_size();
    let req = req_view(r, bs);
    router.pods.clear();
    for &e in &index.decode {
        router
            .pods
            .push(pod_view(e, r, engines, flows, &router.book));
    }
    let j = policies.choose(Role::Decode, &req, &router.pods)?;
    let decoder = index.decode[j];
    if !policies.decide(&req, &router.pods[j])? {
        return Ok((decoder, None));
    }
    router.pods.clear();
    for &e in &index.prefill {
        router
            .pods
            .push(pod_view(e, r, engines, flows, &router.book));
    }
    let i = policies.choose(Role::Prefill, &req, &router.pods)?;
    Ok((decoder, Some(index.prefill[i])))
}

/// System: the sidecar receives the prefillers' answers (prefill legs that
/// finished this tick). The prefiller's blocks become a lease; the decode
/// leg goes to the decoder carrying where the KV is (NIXL pull), or the KV
/// is first copied out (store-and-forward).
#[allow(clippy::too_many_arguments)]
pub fn handoff_system(
    mut commands: Commands,
    clock: Res<Clock>,
    mut handoffs: ResMut<Handoffs>,
    mut flows: ResMut<Flows>,
    mut engines: Query<(&mut Engine, &Nic)>,
    mut reqs: Query<&mut Request>,
    mut router: NonSendMut<Router>,
) {
    let now = clock.now;
    for &id in &handoffs.queue {
        let mut r = reqs.get_mut(id).expect("answered prefill");
        let prefiller = r.prefiller.expect("remote");
        let decoder = r.decoder.expect("routed");
        r.t1 = Some(now);
        let blocks = std::mem::take(&mut r.blocks);
        r.lease = Some(
            commands
                .spawn(Lease {
                    prefiller,
                    request: id,
                    blocks,
                    since: now,
                })
                .id(),
        );
        let p_index = engines.get(prefiller).expect("prefiller").0.index;
        router.book.prefill_answered(p_index, r.prompt);
        match flows.mode {
            TransferMode::NixlPull => {
                r.start_decode_leg(KvSource::RemotePending);
                engines.get_mut(decoder).expect("decoder").0.enqueue(id);
            }
            TransferMode::StoreAndForward => {
                r.start_decode_leg(KvSource::RemotePending);
                r.status = Status::PrefillDone; // until the copy completes
                r.remote_tokens = r.prompt;
                let p_link = engines.get(prefiller).expect("prefiller").1.link;
                let d_link = engines.get(decoder).expect("decoder").1.link;
                start_copy(
                    &mut flows,
                    &mut commands,
                    id,
                    [p_link, d_link],
                    r.prompt,
                    now,
                );
            }
        }
    }
    handoffs.queue.clear();
}
