//! The agenda: future events keyed on (time, rank, sequence number).
//!
//! Events at one instant are delivered together as one tick; `rank` is the
//! position of the system that handles the event in the tick's order
//! ([`crate::sim::SimSystems`]), and the sequence number (insertion order)
//! breaks the remaining ties, so the order never depends on a heap's whim.

use bevy_ecs::prelude::*;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Something scheduled to happen at a future instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event {
    /// A hot-swap phase starts (index into the scenario's phases).
    Phase(u32),
    /// A new session arrives (Poisson process).
    SessionArrival,
    /// A session's tool call ended: it issues its next turn.
    NextTurn(Entity),
    /// A trace request reaches the gateway (index into the trace).
    TraceArrival(u32),
    /// A read's fixed latency ended: its flow starts.
    ReadStart(Entity),
    /// The earliest flow completion computed at allocation `generation`.
    FlowDone { generation: u64 },
    /// An engine's step ends (stale when the engine's step generation moved
    /// on: a run of repeated steps was cut short).
    StepEnd(Entity, u64),
    /// A fault starts (`start`) or ends (index into the scenario's faults).
    Fault { index: u32, start: bool },
    /// The router learns that pod `pod` (prefillers first) is down or up.
    RouterLearns { pod: u32, up: bool },
    /// The sidecar sends a failed prefill leg again (same prefiller).
    PrefillRetry(Entity),
    /// The client sends a failed request again.
    ClientRetry(Entity),
    /// Push mode: a decoder's registration of a request's blocks reaches
    /// the prefiller.
    Registration(Entity),
}

impl Event {
    /// The system that handles it, in tick order.
    pub fn rank(&self) -> u8 {
        match self {
            Event::Phase(_) | Event::Fault { .. } | Event::RouterLearns { .. } => 0,
            Event::SessionArrival | Event::NextTurn(_) | Event::TraceArrival(_) => 1,
            Event::PrefillRetry(_) | Event::ClientRetry(_) => 2,
            Event::ReadStart(_) | Event::FlowDone { .. } | Event::Registration(_) => 3,
            Event::StepEnd(..) => 4,
        }
    }
}

/// An event and its key: (time, rank, sequence number) packed into two
/// words that compare as integers in the same order, for a cheaper heap.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The time's bits, mapped so that unsigned order is `f64::total_cmp`'s.
    time: u64,
    /// The rank in the top byte, the sequence number below.
    rank_seq: u64,
    event: Event,
}

/// The bits of `time`, flipped so that their unsigned order is
/// `f64::total_cmp`'s ([`time_of`] flips them back).
fn time_key(time: f64) -> u64 {
    let bits = time.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

fn time_of(key: u64) -> f64 {
    f64::from_bits(if key >> 63 == 1 {
        key & !(1 << 63)
    } else {
        !key
    })
}

/// Sequence numbers below 2^56 (more events than a run can schedule).
const SEQ_BITS: u32 = 56;

impl Entry {
    fn key(&self) -> (u64, u64) {
        (self.time, self.rank_seq)
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    // Reversed: BinaryHeap is a max-heap and we pop the earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        other.key().cmp(&self.key())
    }
}

#[derive(Resource, Default)]
pub struct Agenda {
    heap: BinaryHeap<Entry>,
    seq: u64,
}

impl Agenda {
    pub fn schedule(&mut self, time: f64, event: Event) {
        debug_assert!(time.is_finite(), "event {event:?} at {time}");
        self.seq += 1;
        debug_assert!(self.seq < 1 << SEQ_BITS);
        self.heap.push(Entry {
            time: time_key(time),
            rank_seq: (event.rank() as u64) << SEQ_BITS | self.seq,
            event,
        });
    }

    pub fn next_time(&self) -> Option<f64> {
        self.heap.peek().map(|e| time_of(e.time))
    }

    /// Pops the next event if it happens at `time`.
    pub fn pop_at(&mut self, time: f64) -> Option<Event> {
        if time_of(self.heap.peek()?.time) == time {
            self.heap.pop().map(|e| e.event)
        } else {
            None
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_time_then_rank_then_insertion() {
        let mut a = Agenda::default();
        let e = Entity::from_raw_u32(7).unwrap();
        a.schedule(2.0, Event::SessionArrival);
        a.schedule(1.0, Event::StepEnd(e, 0));
        a.schedule(1.0, Event::ReadStart(e));
        a.schedule(1.0, Event::NextTurn(e));
        a.schedule(1.0, Event::StepEnd(Entity::from_raw_u32(8).unwrap(), 0));
        assert_eq!(a.next_time(), Some(1.0));
        let got: Vec<Event> = std::iter::from_fn(|| a.pop_at(1.0)).collect();
        assert_eq!(
            got,
            vec![
                Event::NextTurn(e),
                Event::ReadStart(e),
                Event::StepEnd(e, 0),
                Event::StepEnd(Entity::from_raw_u32(8).unwrap(), 0)
            ]
        );
        assert_eq!(a.pop_at(1.0), None);
        assert_eq!(a.next_time(), Some(2.0));
    }

    #[test]
    fn time_keys_order_as_total_cmp_and_give_the_time_back() {
        let times = [
            f64::NEG_INFINITY,
            -2.5,
            -f64::MIN_POSITIVE,
            -0.0,
            0.0,
            5e-324,
            1.0,
            1.0 + f64::EPSILON,
            1e300,
            f64::INFINITY,
        ];
        for w in times.windows(2) {
            assert!(time_key(w[0]) < time_key(w[1]), "{} < {}", w[0], w[1]);
        }
        for t in times {
            assert_eq!(time_of(time_key(t)).to_bits(), t.to_bits());
        }
    }
}
