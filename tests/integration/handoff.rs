//! The KV hand-off beyond the happy path, derived by hand on the tiny
//! deployment (steps of max(10 ms, 1 ms per token), NICs of 1000 tokens/s,
//! x0 = 5 ms, push notifications of 1 ms): push mode, parallel dispatch,
//! lease expiry and heartbeats, a decoder going down.

use bevy_ecs::prelude::*;

use pdsim::engine::Request;
use pdsim::router::RouterMode;
use pdsim::shared::{FaultCommand, FaultQueue};
use pdsim::{Sim, SimSystems};

use crate::common::{assert_close, req, run_trace, tiny};

#[test]
fn push_serial_is_pulls_lifecycle_with_one_notification_more() {
    // One remote request, prompt 40: the prefiller's step takes 40 ms,
    // answered at 0.04; the idle decoder parks it at 0.04.
    // Pull: READ posted, flow from 0.045, 40 tokens at 1000/s → 0.085;
    // first token after one 10 ms step: 0.095.
    // Push: the registration reaches the prefiller at 0.041, the WRITE
    // starts x0 later, 0.046 → done 0.086; first token 0.096.
    for (mode, read_done, lease) in [("NixlPull", 0.085, 0.045), ("NixlPush", 0.086, 0.046)] {
        let sc = tiny(&[&format!("transfer.mode={mode}")]);
        let out = run_trace(&sc, vec![req(0.0, 40, 2, None, true)]);
        let r = out.req(0);
        assert_close(r.t1.unwrap(), 0.04, "answered");
        assert_close(r.parked_at.unwrap(), 0.04, "parked");
        assert_close(r.read_done_at.unwrap(), read_done, mode);
        assert_close(r.first_token_at.unwrap(), read_done + 0.01, "first token");
        assert_close(out.report.mean("lease").unwrap(), lease, "lease");
    }
}

/// A decoder busy with a local request decoding from t = 0 (10 tokens of
/// prompt: its steps end at 0.01, 0.02, …), and a remote request arriving
/// at 0.001.
fn busy_decoder(mode: &str, dispatch: &str) -> Request {
    let sc = tiny(&[
        &format!("transfer.mode={mode}"),
        &format!("router.dispatch={dispatch}"),
    ]);
    let out = run_trace(
        &sc,
        vec![
            req(0.0, 10, 100, None, false),
            req(0.001, 40, 2, None, true),
        ],
    );
    out.req(1).clone()
}

#[test]
fn parallel_dispatch_writes_at_the_prefills_end_when_the_booking_came_first() {
    // Prefill of the remote request: 0.001 → 0.041.
    // Serial: the decode leg reaches the decoder at 0.041, mid-step; it is
    // parked at the step's end, 0.05. Pull reads from 0.055 → 0.095; push
    // registers at 0.051, writes from 0.056 → 0.096.
    let pull = busy_decoder("NixlPull", "Serial");
    assert_close(
        pull.parked_at.unwrap(),
        0.05,
        "serial: parked at the next step end",
    );
    assert_close(pull.read_done_at.unwrap(), 0.095, "pull read");
    let push = busy_decoder("NixlPush", "Serial");
    assert_close(push.read_done_at.unwrap(), 0.096, "push serial write");
    // Parallel: the decode leg reaches the decoder at 0.001 with the
    // prefill leg and is parked at the step's end, 0.01 (its blocks booked
    // while the prefill runs); registered at 0.011. At the prefill's end,
    // 0.041, the write is posted: 0.046 → 0.086, a decoder step earlier.
    let parallel = busy_decoder("NixlPush", "Parallel");
    assert_close(
        parallel.parked_at.unwrap(),
        0.01,
        "parallel: booked during the prefill",
    );
    assert_close(parallel.t1.unwrap(), 0.041, "answered");
    assert_close(
        parallel.read_started_at.unwrap(),
        0.046,
        "write at the prefill's end + x0",
    );
    assert_close(parallel.read_done_at.unwrap(), 0.086, "parallel write");
}

#[test]
fn parallel_dispatch_with_pull_is_refused() {
    let err = pdsim::scenario::load(
        std::path::Path::new("tests/scenarios/tiny.ron"),
        &["router.dispatch=Parallel".to_string()],
    )
    .expect_err("refused")
    .to_string();
    assert!(
        err.contains("router.dispatch: Parallel needs transfer.mode: NixlPush"),
        "{err}"
    );
}

/// Room for requests of a few hundred tokens.
const ROOMY: [&str; 4] = [
    "decode.engine.max_model_len=1024",
    "prefill.engine.max_model_len=1024",
    "decode.engine.num_gpu_blocks=300",
    "prefill.engine.num_gpu_blocks=300",
];

/// The tiny deployment with one slot on the decoder, taken by a local
/// request of 10 prompt tokens decoding 300 tokens (steps of 10 ms: it
/// finishes at 3.0 s); a remote request of 40 tokens arrives at 0.001 and
/// waits for the slot. Its lease is granted at the answer, 0.041.
fn long_decoder_queue(sets: &[&str]) -> crate::common::Outcome {
    let mut all = vec!["decode.engine.max_num_seqs=1"];
    all.extend_from_slice(&ROOMY);
    all.extend_from_slice(sets);
    run_trace(
        &tiny(&all),
        vec![
            req(0.0, 10, 300, None, false),
            req(0.001, 40, 2, None, true),
        ],
    )
}

#[test]
fn a_lease_without_heartbeats_expires_while_its_request_waits() {
    // Pull, lease of 1 s without heartbeats: it expires at 1.041 and the
    // prefiller frees its blocks (10 of 4 tokens, cached). The slot frees
    // at 3.0; the request is parked and read (from freed blocks, which vLLM
    // only logs) from 3.005 to 3.045.
    let out = long_decoder_queue(&[
        "transfer.lease.duration=1",
        "transfer.lease.heartbeats=false",
    ]);
    assert_eq!(out.at(1.0).p_held_blocks, 10, "leased until the expiry");
    assert_eq!(out.at(1.05).p_held_blocks, 0, "freed at 1.041");
    let r = out.req(1);
    assert_close(r.read_done_at.unwrap(), 3.045, "read after the slot freed");
    let c = &out.report.counters;
    assert_eq!((c["leases_expired"], c["reads_of_freed_blocks"]), (1, 1));
    // Push: the prefiller never writes after the expiry: the request stays
    // parked for ever, counted in flight and stuck.
    let out = long_decoder_queue(&[
        "transfer.mode=NixlPush",
        "transfer.lease.duration=1",
        "transfer.lease.heartbeats=false",
        "horizon=10",
    ]);
    assert!(!out.requests.contains_key(&1));
    let c = &out.report.counters;
    assert_eq!(
        (
            c["leases_expired"],
            c["requests_stuck"],
            c["requests_in_flight"]
        ),
        (1, 1, 1)
    );
}

#[test]
fn heartbeats_keep_a_lease_alive_across_a_long_decoder_queue() {
    // Lease of 6 s: the decoder heartbeats every 1 s from 0.041, each
    // extending it to then + 4 s, so the 3 s wait never reaches a deadline
    // that is not renewed: no expiry, the read at 3.005–3.045 as in pull.
    let out = long_decoder_queue(&["transfer.lease.duration=6"]);
    assert_close(out.req(1).read_done_at.unwrap(), 3.045, "read");
    assert_eq!(out.report.counters["leases_expired"], 0);
    // The same wait with a lease of 2 s without heartbeats: expired at 2.041.
    let out = long_decoder_queue(&[
        "transfer.lease.duration=2",
        "transfer.lease.heartbeats=false",
    ]);
    assert_eq!(out.report.counters["leases_expired"], 1);
    assert_eq!(out.at(2.0).p_held_blocks, 10);
    assert_eq!(out.at(2.05).p_held_blocks, 0);
}

#[test]
fn a_decoder_down_fails_its_requests_and_strands_their_leases() {
    // The long queue with a local request of 600 tokens (it would finish at
    // 6.0), a lease of 6 s (heartbeats every 1 s, each to then + 4 s), and
    // the decoder down at 3.5 s. Both requests on it fail at 3.5.
    // Heartbeats at 1.041, 2.041, 3.041, none after 3.5: the deadline at
    // 6.041 finds 3.041 + 4 = 7.041 later and moves there; at 7.041 nothing
    // newer: it expires at the last heartbeat + 4 s. Stranded from 3.5 to
    // 7.041: 40 tokens × 3.541 s = 141.64 token·s.
    let fault = r#"faults=[{"PodDown":{"pod":"decode-0","at":3.5,"duration":100}}]"#;
    let mut sets = vec![
        "decode.engine.max_num_seqs=1",
        "transfer.lease.duration=6",
        "horizon=20",
        fault,
    ];
    sets.extend_from_slice(&ROOMY);
    let sc = tiny(&sets);
    let out = run_trace(
        &sc,
        vec![
            req(0.0, 10, 600, None, false),
            req(0.001, 40, 2, None, true),
        ],
    );
    assert_eq!(
        out.at(7.0).p_held_blocks,
        10,
        "stranded until the lease expires"
    );
    assert_eq!(out.at(7.05).p_held_blocks, 0, "expired at 7.041");
    let c = &out.report.counters;
    assert_eq!(
        c["requests_failed_decoder_down"], 2,
        "both requests were on the decoder"
    );
    assert_eq!(c["leases_expired"], 1);
    assert_eq!(
        c["stranded_kv_token_seconds"], 142,
        "40 × (7.041 − 3.5) = 141.64"
    );
    assert_eq!(
        c["requests_arrived"],
        c["requests_finished"]
            + c["requests_too_long"]
            + c["requests_failed"]
            + c["requests_in_flight"],
        "every request accounted for"
    );
}

#[test]
fn a_custom_system_can_take_a_pod_down() {
    // The same from Rust: a system of the user's puts a command in the
    // fault queue at its first tick from 3.5 s on.
    let mut sets = vec!["decode.engine.max_num_seqs=1", "horizon=20"];
    sets.extend_from_slice(&ROOMY);
    let sc = tiny(&sets);
    let mut sim = Sim::with_trace(
        &sc,
        RouterMode::Direct,
        vec![
            req(0.0, 10, 600, None, false),
            req(0.001, 40, 2, None, true),
        ],
    )
    .unwrap();
    sim.add_systems(
        (|clock: Res<pdsim::shared::Clock>, mut q: ResMut<FaultQueue>, mut done: Local<bool>| {
            if clock.now >= 3.5 && !*done {
                q.commands.push(FaultCommand::PodDown { pod: 1 });
                *done = true;
            }
        })
        .before(SimSystems::Faults),
    );
    let report = sim.run().unwrap();
    assert_eq!(report.counters["requests_failed_decoder_down"], 2);
    assert_eq!(report.counters["requests_finished"], 0);
}

#[test]
fn the_sidecar_and_the_client_retry_a_prefill_whose_prefiller_is_down() {
    // A remote request at 0; the prefiller goes down at 0.02, mid-prefill,
    // for 0.3 s. The leg fails at 0.02; the sidecar sends it again to the
    // same prefiller 0.2 s later (llm-d's --prefill-retry-backoff), at
    // 0.22: still down, it fails again; the second retry, at 0.42, finds it
    // back: prefilled by 0.46, read 0.465 → 0.505, first token 0.515.
    let fault = r#"faults=[{"PodDown":{"pod":"prefill-0","at":0.02,"duration":0.3}}]"#;
    let sc = tiny(&[fault, "router.prefill_max_retries=2"]);
    let out = run_trace(&sc, vec![req(0.0, 40, 2, None, true)]);
    assert_close(out.req(0).t1.unwrap(), 0.46, "answered after two retries");
    assert_close(out.req(0).first_token_at.unwrap(), 0.515, "first token");
    assert_eq!(out.report.counters["prefill_retries"], 2);
    // With one sidecar retry the leg fails for good at 0.22; the client
    // sends the request again 2 s later, at 2.22: first token at 2.22 +
    // 0.04 + 0.005 + 0.04 + 0.01 = 2.315, counted from its first arrival.
    let sc = tiny(&[
        fault,
        "router.prefill_max_retries=1",
        "client.retries=1",
        "client.backoff=2",
    ]);
    let out = run_trace(&sc, vec![req(0.0, 40, 2, None, true)]);
    assert_close(
        out.req(0).first_token_at.unwrap(),
        2.315,
        "after the client's retry",
    );
    assert_close(
        out.report.mean("ttft").unwrap(),
        2.315,
        "TTFT from the first attempt",
    );
    let c = &out.report.counters;
    assert_eq!(
        (
            c["prefill_retries"],
            c["client_retries"],
            c["requests_failed"]
        ),
        (1, 1, 0)
    );
    // No retries at all: it fails for good at 0.02, and counts.
    let out = run_trace(&tiny(&[fault]), vec![req(0.0, 40, 2, None, true)]);
    let c = &out.report.counters;
    assert_eq!(
        (
            c["requests_failed"],
            c["requests_failed_prefiller_down"],
            c["requests_finished"]
        ),
        (1, 1, 0)
    );
}

#[test]
fn a_lost_prefill_answer_strands_its_lease_until_expiry() {
    // Every answer lost in [0, 1): the request never reaches its decoder
    // and waits for ever; the prefiller's lease (10 blocks, 40 tokens)
    // expires at 0.04 + 30 s, stranded all along: 40 × 30 = 1200 token·s.
    let lost = r#"faults=[{"PrefillAnswerLost":{"at":0,"duration":1,"probability":1}}]"#;
    let out = run_trace(
        &tiny(&[lost, "horizon=40"]),
        vec![req(0.0, 40, 2, None, true)],
    );
    let c = &out.report.counters;
    assert_eq!(
        (
            c["requests_stuck"],
            c["requests_in_flight"],
            c["leases_expired"]
        ),
        (1, 1, 1)
    );
    assert_eq!(c["stranded_kv_token_seconds"], 1200);
    assert_eq!(out.at(30.0).p_held_blocks, 10);
    assert_eq!(out.at(30.05).p_held_blocks, 0);
}

#[test]
fn lost_heartbeats_let_a_lease_expire_in_a_long_queue() {
    // The long queue with a lease of 6 s renewed every 1 s, but every
    // heartbeat lost: it expires at 6.041 while its request waits.
    let mut sets = vec![
        "decode.engine.max_num_seqs=1",
        "transfer.lease.duration=6",
        r#"faults=[{"HeartbeatLoss":{"at":0,"duration":100,"probability":1}}]"#,
    ];
    sets.extend_from_slice(&ROOMY);
    let out = run_trace(
        &tiny(&sets),
        vec![
            req(0.0, 10, 700, None, false),
            req(0.001, 40, 2, None, true),
        ],
    );
    let c = &out.report.counters;
    assert_eq!((c["leases_expired"], c["reads_of_freed_blocks"]), (1, 1));
    assert_eq!(out.at(6.0).p_held_blocks, 10);
    assert_eq!(out.at(6.05).p_held_blocks, 0);
}

#[test]
fn a_slow_nic_slows_the_reads_through_it() {
    // The decoder's NIC at a tenth (100 tokens/s) over [0, 1): the read of
    // 40 tokens from 0.045 takes 0.4 s, done at 0.445.
    let slow = r#"faults=[{"NicSlow":{"pod":"decode-0","at":0,"duration":1,"factor":0.1}}]"#;
    let out = run_trace(&tiny(&[slow]), vec![req(0.0, 40, 2, None, true)]);
    assert_close(
        out.req(0).read_done_at.unwrap(),
        0.445,
        "read at 100 tokens/s",
    );
    // It recovers at 0.2: 15.5 tokens moved by then (0.155 s at 100/s), the
    // last 24.5 at 1000/s take 0.0245 s → 0.2245.
    let slow = r#"faults=[{"NicSlow":{"pod":"decode-0","at":0,"duration":0.2,"factor":0.1}}]"#;
    let out = run_trace(&tiny(&[slow]), vec![req(0.0, 40, 2, None, true)]);
    assert_close(
        out.req(0).read_done_at.unwrap(),
        0.2245,
        "read speeds up at 0.2",
    );
}

#[test]
fn impossible_faults_are_refused_before_the_run() {
    let load = |set: &str| {
        pdsim::scenario::load(
            std::path::Path::new("tests/scenarios/tiny.ron"),
            &[set.to_string()],
        )
        .expect_err("refused")
        .to_string()
    };
    let err = load(r#"faults=[{"PodDown":{"pod":"decode-3","at":1,"duration":5}}]"#);
    assert!(err.contains("faults.0: there is no pod `decode-3` (did you mean `decode-0`?); the pods are prefill-0, decode-0"), "{err}");
    let err = load(r#"faults=[{"PodDown":{"pod":"decode-0","at":1,"duration":-5}}]"#);
    assert!(
        err.contains("faults.0.duration must be a positive number of seconds, got -5"),
        "{err}"
    );
    let err = load(r#"faults=[{"HeartbeatLoss":{"at":1,"duration":5,"probability":1.5}}]"#);
    assert!(
        err.contains("faults.0.probability must be in [0, 1]"),
        "{err}"
    );
    let err = load("transfer.lease.duration=3");
    assert!(err.contains("at least 6 s with heartbeats"), "{err}");
}

#[test]
fn a_booking_not_granted_before_the_prefill_ends_keeps_the_lease_until_it_is() {
    // Parallel dispatch onto the decoder whose one slot is busy until 3.0:
    // the decode leg cannot be admitted (parking needs a free slot), so
    // nothing is booked when the prefill ends at 0.041. The prefiller
    // holds the lease; at 3.0 the decoder parks the request, registers
    // (3.001), and the write runs 3.006 → 3.046: a lease of 3.005 s.
    let out = long_decoder_queue(&["transfer.mode=NixlPush", "router.dispatch=Parallel"]);
    let r = out.req(1);
    assert_close(r.parked_at.unwrap(), 3.0, "booked when the slot freed");
    assert_close(
        r.read_started_at.unwrap(),
        3.006,
        "write after the registration",
    );
    assert_close(r.read_done_at.unwrap(), 3.046, "written");
    assert_close(
        out.report.mean("lease").unwrap(),
        3.046 - 0.041,
        "lease held meanwhile",
    );
    assert_eq!(out.at(2.0).p_held_blocks, 10, "the prefiller holds the KV");
}

#[test]
fn a_failed_prefill_leg_is_released_from_the_routers_books_once() {
    // decoder_failure: a decoder goes down and comes back; prefill legs
    // fail, some after their prefiller answered. At the end each
    // prefiller's in-flight count in the router's books must be its prefill
    // legs still unanswered (a leg answered and then failed used to be
    // released twice, and the count wrapped below zero).
    use pdsim::engine::{Leg, Role};
    use pdsim::router::Router;
    use pdsim::shared::EngineIndex;
    let sc = crate::common::scenario_with("scenarios/decoder_failure.ron", &[]);
    let mut sim = pdsim::sim::Sim::new(&sc).unwrap();
    let report = sim.run().unwrap();
    assert!(
        report.to_json().contains("decoder_down"),
        "the fault fails requests"
    );
    let index = sim.world.resource::<EngineIndex>().clone();
    for (p, &e) in index.prefill.iter().enumerate() {
        let unanswered = sim
            .world
            .query::<&Request>()
            .iter(&sim.world)
            .filter(|r| r.leg == Leg::Prefill && r.t1.is_none() && r.prefiller == Some(e))
            .count() as u64;
        let (requests, _) = sim
            .world
            .non_send::<Router>()
            .book
            .in_flight(Role::Prefill, p as u32);
        assert_eq!(requests, unanswered, "prefiller {p}");
    }
}
