//! Leases as vLLM 0.33 keeps them (`NixlBaseConnectorScheduler`, the
//! workers' lease reaper): granted at the prefill's finish for `duration`;
//! the decoder heartbeats every `⌊duration / 6⌋` seconds from the moment the
//! decode request reaches it, each heartbeat extending the lease to at
//! least then + `⌊2 · duration / 3⌋`; an expired lease frees the
//! prefiller's blocks, which stay cached.
//!
//! Heartbeats are counted lazily: a lease's deadline is booked once
//! ([`crate::shared::Deadlines`]); only if it is reached are the heartbeats
//! since the last look counted (each lost with the faults' probability),
//! and the deadline moved to the last one's extension. A lease that ends in
//! time costs no tick and no heartbeat.

use bevy_ecs::prelude::*;
use rand::RngExt;

use crate::engine::BlockId;
use crate::scenario::{Fault, LeaseConfig};
use crate::shared::{Deadlines, Joining};
use crate::transfer::{Lease, LeaseState};

/// Seconds between heartbeats and how far each extends the lease
/// (vLLM: `duration // 6` and `duration * 2 // 3`).
pub fn heartbeat_interval_and_extension(c: &LeaseConfig) -> (f64, f64) {
    ((c.duration / 6.0).floor(), (c.duration * 2.0 / 3.0).floor())
}

/// What a new lease is granted for.
pub struct NewLease {
    pub prefiller: Entity,
    /// The request whose decode leg reads it.
    pub request: Entity,
    pub blocks: Vec<BlockId>,
    pub block_size: u32,
    /// It expires (not under store-and-forward, which is not vLLM's).
    pub expires: bool,
    /// Heartbeats renew it (not with push's parallel dispatch in vLLM 0.33).
    pub renewable: bool,
    /// When its decode leg reached the decoder (heartbeats start there).
    pub heartbeats_from: Option<f64>,
    /// No decoder will read it (the answer was lost, the decoder is gone).
    pub stranded: bool,
    /// Flows of its transfer already started (store-and-forward's copy).
    pub parts_left: u32,
}

/// A lease granted `now`, its expiry booked; returns its entity. It joins
/// the world when `commands` are applied, and is found in `joining` until
/// then (a fast tick's reads look up the leases it granted).
pub fn grant(
    commands: &mut Commands,
    joining: &mut Joining<Lease>,
    deadlines: &mut Deadlines,
    config: &LeaseConfig,
    new: NewLease,
    now: f64,
) -> Entity {
    let id = joining.reserve();
    let expires_at = if new.expires {
        now + config.duration
    } else {
        f64::INFINITY
    };
    let deadline = new.expires.then(|| deadlines.insert(expires_at, id));
    let lease = Lease {
        prefiller: new.prefiller,
        request: new.request,
        tokens: new.blocks.len() as u64 * u64::from(new.block_size),
        blocks: new.blocks,
        since: now,
        parts_left: new.parts_left,
        state: LeaseState::Held,
        expires_at,
        deadline,
        heartbeats_from: new.heartbeats_from,
        heartbeats_until: if new.stranded { now } else { f64::INFINITY },
        heartbeats_seen: now,
        renewable: new.renewable && config.heartbeats,
        stranded_since: new.stranded.then_some(now),
    };
    joining.keep(commands, id, lease);
    id
}

/// The heartbeats of `lease` in `(heartbeats_seen, now]` that reached the
/// prefiller: the latest one's extension, if it is later than `now`.
pub fn renewal(
    lease: &mut Lease,
    now: f64,
    config: &LeaseConfig,
    faults: &[Fault],
    rng: &mut rand_xoshiro::Xoshiro256PlusPlus,
) -> Option<f64> {
    let seen = lease.heartbeats_seen;
    lease.heartbeats_seen = now;
    if !lease.renewable {
        return None;
    }
    let from = lease.heartbeats_from?;
    let (interval, extension) = heartbeat_interval_and_extension(config);
    // The prefiller knows the lease from its grant: earlier heartbeats
    // renew nothing.
    let lo = seen.max(lease.since);
    let hi = now.min(lease.heartbeats_until);
    let mut k = ((lo - from) / interval).floor().max(0.0) + 1.0;
    let mut last = None;
    loop {
        let h = from + k * interval;
        if h > hi {
            break;
        }
        k += 1.0;
        if h <= lo {
            continue;
        }
        let loss: f64 = faults
            .iter()
            .filter_map(|f| match f {
                Fault::HeartbeatLoss { probability, .. } if f.covers(h) => Some(*probability),
                _ => None,
            })
            .fold(0.0, f64::max);
        if loss > 0.0 && rng.random::<f64>() < loss {
            continue;
        }
        last = Some(h);
    }
    last.map(|h| h + extension).filter(|&t| t > now)
}

/// No decoder will read the lease from `now` on: its KV is stranded until
/// it ends, and its heartbeats stop.
pub fn strand(lease: &mut Lease, now: f64) {
    lease.heartbeats_until = lease.heartbeats_until.min(now);
    lease.stranded_since.get_or_insert(now);
}

/// Token·seconds of stranded KV when the lease ends at `now`.
pub fn stranded_token_seconds(lease: &Lease, now: f64) -> f64 {
    match lease.stranded_since {
        Some(s) => lease.tokens as f64 * (now - s).max(0.0),
        None => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn lease(since: f64, from: f64) -> Lease {
        Lease {
            prefiller: Entity::from_raw_u32(1).unwrap(),
            request: Entity::from_raw_u32(2).unwrap(),
            blocks: Vec::new(),
            tokens: 0,
            since,
            parts_left: 0,
            state: LeaseState::Held,
            expires_at: since + 30.0,
            deadline: None,
            heartbeats_from: Some(from),
            heartbeats_until: f64::INFINITY,
            heartbeats_seen: since,
            renewable: true,
            stranded_since: None,
        }
    }

    #[test]
    fn heartbeats_renew_by_hand() {
        let c = LeaseConfig::default();
        assert_eq!(heartbeat_interval_and_extension(&c), (5.0, 20.0));
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(1);
        // Granted at 10, the decode request reached the decoder at 10:
        // heartbeats at 15, 20, …, 40 ≤ 40 (the deadline, 10 + 30): the
        // last, 40, extends to 60.
        let mut l = lease(10.0, 10.0);
        assert_eq!(renewal(&mut l, 40.0, &c, &[], &mut rng), Some(60.0));
        // At 60: heartbeats 45 … 60, the last extends to 80.
        assert_eq!(renewal(&mut l, 60.0, &c, &[], &mut rng), Some(80.0));
        // The decoder died at 62: no heartbeat after 60 counts, so at 80
        // the lease expires.
        l.heartbeats_until = 62.0;
        assert_eq!(renewal(&mut l, 80.0, &c, &[], &mut rng), None);
        // Every heartbeat lost: no renewal.
        let mut l = lease(10.0, 10.0);
        let loss = [Fault::HeartbeatLoss {
            at: 0.0,
            duration: 100.0,
            probability: 1.0,
        }];
        assert_eq!(renewal(&mut l, 40.0, &c, &loss, &mut rng), None);
        // Parallel dispatch: the decoder heartbeats from 2 (its booking),
        // the lease is granted at 9: heartbeats 12 … 37 count, 37 → 57.
        let mut l = lease(9.0, 2.0);
        assert_eq!(renewal(&mut l, 39.0, &c, &[], &mut rng), Some(57.0));
    }
}
