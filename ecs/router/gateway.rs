//! The routing system: every request that reached the gateway this tick is
//! routed by the scripts, in arrival order — the decode profile picks a
//! decoder, the decider says whether to prefill remotely, and then the
//! prefill profile picks a prefiller.

use bevy_ecs::prelude::*;

use crate::engine::{Engine, KvPool, KvSource, Leg, Request, RequestStore, Role, Status, reusable};
use crate::error::Error;
use crate::router::book::RouterBook;
use crate::router::policy::{PodView, ReqView};
use crate::router::{Router, RouterMode};
use crate::scenario::Dispatch;
use crate::shared::{
    Clock, CurrentScenario, EngineIndex, FailReason, Failed, Gateway, RunStatus, TickEvents,
};
use crate::transfer::{Flows, Nic};

pub fn req_view(r: &Request, block_size: u32, now: f64) -> ReqView {
    ReqView {
        id: r.id as i64,
        session: r.session as i64,
        turn: r.turn as i64,
        prompt_tokens: r.prompt as i64,
        new_tokens: r.new_tokens as i64,
        block_size: block_size as i64,
        arrival_time: r.t0,
        now,
    }
}

/// What a policy sees of instance `e` while routing request `r`.
fn pod_view(
    e: Entity,
    r: &Request,
    engines: &Query<(&mut Engine, &mut KvPool)>,
    nics: &Query<&Nic>,
    flows: &Flows,
    book: &RouterBook,
) -> PodView {
    let (eng, kv) = engines.get(e).expect("engine");
    let nic = nics.get(e).expect("engine");
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
        nic_capacity: f64::from(nic.links) * nic.tokens_per_s,
        nic_rate: flows.pod_rate[nic.pod as usize],
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

/// System: route every request that reached the gateway this tick (and
/// those its client sends again); send failed prefill legs again to their
/// prefiller (the sidecar's retries).
#[allow(clippy::too_many_arguments)]
pub fn routing_system(
    mut commands: Commands,
    clock: Res<Clock>,
    events: Res<TickEvents>,
    mut gateway: ResMut<Gateway>,
    mut router: NonSendMut<Router>,
    index: Res<EngineIndex>,
    mut engines: Query<(&mut Engine, &mut KvPool)>,
    nics: Query<&Nic>,
    mut reqs: Query<&mut Request>,
    flows: Res<Flows>,
    mut status: ResMut<RunStatus>,
    mut failed: ResMut<Failed>,
    scenario: Res<CurrentScenario>,
) {
    route_gateway(
        clock.now,
        &events,
        &mut gateway,
        &mut router,
        &index,
        (&mut engines, &nics, &mut reqs),
        &flows,
        &mut status,
        &mut failed,
        scenario.0.router.dispatch == Dispatch::Parallel,
        &mut commands,
    );
}

/// The body of [`routing_system`], also run by the fast ticks on their own
/// fetch (`sim::schedule`). `commands` spawns a parallel dispatch's decode
/// legs (`parallel`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn route_gateway(
    now: f64,
    events: &TickEvents,
    gateway: &mut Gateway,
    router: &mut Router,
    index: &EngineIndex,
    (engines, nics, reqs): (
        &mut Query<(&mut Engine, &mut KvPool)>,
        &Query<&Nic>,
        &mut impl RequestStore,
    ),
    flows: &Flows,
    status: &mut RunStatus,
    failed: &mut Failed,
    parallel: bool,
    commands: &mut Commands,
) {
    for &id in &events.prefill_retries {
        let r = reqs.req(id);
        let p = r.prefiller.expect("remote");
        let (mut engine, _) = engines.get_mut(p).expect("prefiller");
        if engine.down {
            r.status = Status::Failed;
            failed.queue.push((id, FailReason::PrefillerDown));
        } else {
            r.status = Status::Waiting;
            r.leg_arrived_at = now;
            engine.enqueue(id);
        }
    }
    gateway.queue.extend_from_slice(&events.client_retries);
    if gateway.queue.is_empty() || status.error.is_some() {
        return;
    }
    for i in 0..gateway.queue.len() {
        let id = gateway.queue[i];
        let started = std::time::Instant::now();
        let decision = route(id, router, index, engines, nics, reqs, flows, now);
        router.decisions += 1;
        router.seconds += started.elapsed().as_secs_f64();
        let (decoder, prefiller) = match decision {
            Ok(Some(choice)) => choice,
            Ok(None) => {
                reqs.req(id).status = Status::Failed;
                failed.queue.push((id, FailReason::NoEndpoint));
                continue;
            }
            Err(e) => {
                status.error = Some(e);
                break;
            }
        };
        let d_index = engines.get(decoder).expect("decoder").0.index;
        let p_index = prefiller.map(|p| engines.get(p).expect("prefiller").0.index);
        let r = reqs.req(id);
        tracing::debug!(
            request = r.id,
            session = r.session,
            prompt = r.prompt,
            decoder = d_index,
            prefiller = p_index.map_or(-1, i64::from),
            "routed"
        );
        r.decoder = Some(decoder);
        r.prefiller = prefiller;
        router.book.routed(d_index, p_index, r.prompt, &r.path);
        let Some(p) = prefiller else {
            enqueue(id, r, decoder, engines, failed);
            continue;
        };
        r.leg = Leg::Prefill;
        if parallel {
            // vLLM's push proxy: the decode leg goes out at once, as its
            // own entity (the request), and books its blocks on the decoder
            // while the prefill leg runs.
            let mut twin = r.clone();
            twin.leg = Leg::Decode;
            twin.kv_source = KvSource::RemotePending;
            twin.twin = Some(id);
            let twin_id = commands.spawn_empty().id();
            r.twin = Some(twin_id);
            r.next_turn = None;
            enqueue(id, r, p, engines, failed);
            if engines.get(decoder).expect("decoder").0.down {
                twin.status = Status::Failed;
                failed.queue.push((twin_id, FailReason::DecoderDown));
            } else {
                engines
                    .get_mut(decoder)
                    .expect("decoder")
                    .0
                    .enqueue(twin_id);
            }
            commands.entity(twin_id).insert(twin);
        } else {
            enqueue(id, r, p, engines, failed);
        }
    }
    gateway.queue.clear();
}

/// Sends request `id` to `target`, or fails it there if the pod is down
/// (the router did not know yet).
fn enqueue(
    id: Entity,
    r: &mut Request,
    target: Entity,
    engines: &mut Query<(&mut Engine, &mut KvPool)>,
    failed: &mut Failed,
) {
    let (mut engine, _) = engines.get_mut(target).expect("engine");
    if engine.down {
        r.status = Status::Failed;
        let reason = match engine.role {
            Role::Prefill => FailReason::PrefillerDown,
            Role::Decode => FailReason::DecoderDown,
        };
        failed.queue.push((id, reason));
    } else {
        engine.enqueue(id);
    }
}

/// The llm-d disaggregation profile handler: decode profile, decider, then
/// the prefill profile when the decider says so. Pods the router knows to
/// be down are not candidates; `None` when no pod of a role is left. A
/// decider that takes the prefill pods sees them before it decides.
#[allow(clippy::too_many_arguments)]
fn route(
    id: Entity,
    router: &mut Router,
    index: &EngineIndex,
    engines: &Query<(&mut Engine, &mut KvPool)>,
    nics: &Query<&Nic>,
    reqs: &impl RequestStore,
    flows: &Flows,
    now: f64,
) -> Result<Option<(Entity, Option<Entity>)>, Error> {
    let r = reqs.find(id).expect("request at the gateway");
    let policies = match &mut router.mode {
        RouterMode::Direct => {
            return Ok(Some((
                index.decode[0],
                r.trace_remote.then(|| index.prefill[0]),
            )));
        }
        RouterMode::Scripts(p) => p,
    };
    let bs = engines
        .get(index.decode[0])
        .expect("decoder")
        .1
        .0
        .block_size();
    let req = req_view(r, bs, now);
    let n_prefill = index.prefill.len();
    let views = |pods: &mut Vec<PodView>,
                 candidates: &mut Vec<Entity>,
                 of: &[Entity],
                 first: usize,
                 known_down: &[bool],
                 book: &RouterBook| {
        pods.clear();
        candidates.clear();
        for (k, &e) in of.iter().enumerate() {
            if known_down.get(first + k) == Some(&true) {
                continue;
            }
            candidates.push(e);
            pods.push(pod_view(e, r, engines, nics, flows, book));
        }
    };
    views(
        &mut router.pods,
        &mut router.candidates,
        &index.decode,
        n_prefill,
        &router.known_down,
        &router.book,
    );
    if router.pods.is_empty() {
        return Ok(None);
    }
    let j = policies.choose(Role::Decode, &req, &router.pods)?;
    let decoder = router.candidates[j];
    // The prefill candidates: before the decider when it sees them, else
    // only once it chose to disaggregate. False when every one is down.
    // (Fields, not the router: `policies` borrows its mode.)
    let prefill_views = |pods: &mut Vec<PodView>,
                         candidates: &mut Vec<Entity>,
                         known_down: &[bool],
                         book: &RouterBook| {
        views(pods, candidates, &index.prefill, 0, known_down, book);
        !pods.is_empty()
    };
    let sees_prefill = policies.decider.arity == 3;
    if sees_prefill
        && !prefill_views(
            &mut router.prefill_pods,
            &mut router.prefill_candidates,
            &router.known_down,
            &router.book,
        )
    {
        return Ok(None);
    }
    let prefill_pods = sees_prefill.then_some(&router.prefill_pods[..]);
    if !policies.decide(&req, &router.pods[j], prefill_pods)? {
        return Ok(Some((decoder, None)));
    }
    if !sees_prefill
        && !prefill_views(
            &mut router.prefill_pods,
            &mut router.prefill_candidates,
            &router.known_down,
            &router.book,
        )
    {
        return Ok(None);
    }
    let i = policies.choose(Role::Prefill, &req, &router.prefill_pods)?;
    Ok(Some((decoder, Some(router.prefill_candidates[i]))))
}
