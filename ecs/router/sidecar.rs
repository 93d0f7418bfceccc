//! The llm-d routing sidecar: takes the prefillers' answers and sends the
//! decode leg on (serial dispatch).

use bevy_ecs::prelude::*;

use crate::engine::{Engine, KvSource, Request, Status};
use crate::router::Router;
use crate::scenario::TransferMode;
use crate::shared::{Clock, Handoffs};
use crate::transfer::{Flows, Lease, Nic};

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
        let p_index = engines.get(prefiller).expect("prefiller").0.index;
        router.book.prefill_answered(p_index, r.prompt);
        // A NIXL read's flows start later, when the decoder posts it.
        let mut parts_left = 0;
        match flows.mode {
            TransferMode::NixlPull => {
                r.start_decode_leg(KvSource::RemotePending, now);
                engines.get_mut(decoder).expect("decoder").0.enqueue(id);
            }
            TransferMode::StoreAndForward => {
                r.start_decode_leg(KvSource::RemotePending, now);
                r.status = Status::PrefillDone; // until the copy completes
                r.remote_tokens = r.prompt;
                r.read_started_at = Some(now);
                let p = *engines.get(prefiller).expect("prefiller").1;
                let d = *engines.get(decoder).expect("decoder").1;
                parts_left = flows.start(&mut commands, id, &p, &d, r.prompt, now);
            }
        }
        r.lease = Some(
            commands
                .spawn(Lease {
                    prefiller,
                    request: id,
                    blocks,
                    since: now,
                    parts_left,
                })
                .id(),
        );
    }
    handoffs.queue.clear();
}
