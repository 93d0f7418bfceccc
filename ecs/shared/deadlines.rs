//! Deadlines that usually never come: a lease's expiry is booked when it is
//! granted and removed when its transfer ends first, so a lease that ends
//! in time adds no tick (the agenda cannot take an event back).

use bevy_ecs::prelude::*;
use std::collections::BTreeMap;

/// A deadline's key: its time (as ordered bits of a non-negative f64) and
/// its insertion number.
pub type DeadlineKey = (u64, u64);

#[derive(Resource, Default, Debug)]
pub struct Deadlines {
    map: BTreeMap<DeadlineKey, Entity>,
    seq: u64,
}

impl Deadlines {
    /// Books `entity`'s deadline at `time` (≥ 0); returns its key.
    pub fn insert(&mut self, time: f64, entity: Entity) -> DeadlineKey {
        debug_assert!(time >= 0.0 && time.is_finite(), "deadline at {time}");
        self.seq += 1;
        let key = (time.to_bits(), self.seq);
        self.map.insert(key, entity);
        key
    }

    pub fn remove(&mut self, key: DeadlineKey) {
        self.map.remove(&key);
    }

    pub fn next_time(&self) -> Option<f64> {
        self.map.keys().next().map(|k| f64::from_bits(k.0))
    }

    /// Takes the deadlines at `time` (in booking order).
    pub fn pop_at(&mut self, time: f64, out: &mut Vec<Entity>) {
        while let Some((&key, _)) = self.map.first_key_value() {
            if f64::from_bits(key.0) != time {
                break;
            }
            out.push(self.map.pop_first().expect("just seen").1);
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
