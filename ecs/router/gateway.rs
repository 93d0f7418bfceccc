//! The routing system: every request that reached the gateway this tick is
//! routed by the scripts, in arrival order — the decode profile picks a
//! decoder, the decider says whether to prefill remotely, and then the
//! prefill profile picks a prefiller.

use bevy_ecs::prelude::*;

use crate::engine::{Engine, KvPool, Leg, Request, Role, reusable};
use crate::error::Error;
use crate::router::book::RouterBook;
use crate::router::policy::{PodView, ReqView};
use crate::router::{Router, RouterMode};
use crate::shared::{EngineIndex, Gateway, RunStatus};
use crate::transfer::{Flows, Nic};

pub fn req_view(r: &Request, block_size: u32) -> ReqView {
    ReqView {
        id: r.id as i64,
        session: r.session as i64,
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
    let cached_blocks = kv.cached_prefix_blocks(&r.path, reusable(r.prompt, bs) / bs);
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
        nic_flows: flows.per_pod[nic.pod as usize] as i64,
        router_requests: router_requests as i64,
        router_tokens: router_tokens as i64,
        router_cached_tokens: book.cached_tokens(
            eng.role,
            eng.index,
            &r.path,
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
                    session = r.session,
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
                let d_index = engines.get(decoder).expect("decoder").0.index;
                router.book.routed(
                    d_index,
                    prefiller.map(|p| engines.get(p).expect("prefiller").0.index),
                    r.prompt,
                    &r.path,
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
