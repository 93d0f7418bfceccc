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
    StepEnd(Entity, u32),
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

// Sixteen bytes (a step end's generation is 32 bits): an event passes in
// two registers, and an agenda entry is 32 bytes.
const _: () = assert!(std::mem::size_of::<Event>() == 16);

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
    /// Step ends, apart from the heap and sorted, the earliest last: most
    /// ticks pop one and form the next, and they are few (one per busy
    /// engine, and runs cut short), while the heap holds every session's
    /// next turn. Events come out of the two in their one order.
    steps: Vec<Entry>,
    seq: u64,
    /// Events booked before the run ([`Agenda::book`]), the latest first.
    /// Only the earliest of them waits in the heap (it comes out no later
    /// than any other), so a trace's thousands of arrivals do not deepen
    /// the heap every tick pops.
    booked: Vec<Entry>,
    /// The sequence numbers of the booked events: `booked_seqs.0 <` seq
    /// `<= booked_seqs.1`.
    booked_seqs: (u64, u64),
}

/// The sequence-number bits of an entry's `rank_seq`.
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

impl Agenda {
    #[inline]
    pub fn schedule(&mut self, time: f64, event: Event) {
        let entry = self.entry(time, event);
        if let Event::StepEnd(..) = event {
            // (Entry's order is reversed: the earliest is the greatest.)
            let at = self.steps.partition_point(|e| *e < entry);
            self.steps.insert(at, entry);
        } else {
            self.heap.push(entry);
        }
    }

    #[inline]
    fn entry(&mut self, time: f64, event: Event) -> Entry {
        debug_assert!(time.is_finite(), "event {event:?} at {time}");
        self.seq += 1;
        debug_assert!(self.seq < 1 << SEQ_BITS);
        Entry {
            time: time_key(time),
            rank_seq: (event.rank() as u64) << SEQ_BITS | self.seq,
            event,
        }
    }

    /// Schedules events known before the run, as [`Agenda::schedule`] one
    /// by one in this order would (the same sequence numbers, so the same
    /// order at equal times); each waits outside the heap until it is the
    /// earliest of them. Once per agenda.
    pub fn book(&mut self, events: impl IntoIterator<Item = (f64, Event)>) {
        assert!(
            self.booked_seqs.0 == self.booked_seqs.1,
            "an agenda is booked once"
        );
        let first = self.seq;
        let mut booked: Vec<Entry> = events
            .into_iter()
            .map(|(time, event)| self.entry(time, event))
            .collect();
        // Ascending in `Entry`'s (reversed) order: the earliest last.
        booked.sort_unstable();
        self.booked = booked;
        self.booked_seqs = (first, self.seq);
        self.queue_next_booked();
    }

    #[inline(never)]
    fn queue_next_booked(&mut self) {
        if let Some(entry) = self.booked.pop() {
            self.heap.push(entry);
        }
    }

    /// The earliest event's entry, and whether it is the heap's.
    #[inline]
    fn earliest(&self) -> Option<(&Entry, bool)> {
        match (self.heap.peek(), self.steps.last()) {
            (Some(h), Some(s)) if h > s => Some((h, true)),
            (_, Some(s)) => Some((s, false)),
            (h, None) => h.map(|h| (h, true)),
        }
    }

    pub fn next_time(&self) -> Option<f64> {
        self.earliest().map(|(e, _)| time_of(e.time))
    }

    /// Pops the next event if it happens at `time`.
    // (Inlined into the loop's tick, which calls it for every event.)
    #[inline]
    pub fn pop_at(&mut self, time: f64) -> Option<Event> {
        let (first, in_heap) = self.earliest()?;
        if time_of(first.time) != time {
            return None;
        }
        if !in_heap {
            return self.steps.pop().map(|e| e.event);
        }
        let entry = self.heap.pop()?;
        let seq = entry.rank_seq & SEQ_MASK;
        if seq > self.booked_seqs.0 && seq <= self.booked_seqs.1 {
            self.queue_next_booked();
        }
        Some(entry.event)
    }

    /// Events to come, booked ones included.
    pub fn len(&self) -> usize {
        self.heap.len() + self.steps.len() + self.booked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    fn booked_events_come_out_as_if_scheduled_one_by_one() {
        // The same events, scheduled one by one on one agenda and booked on
        // another (then more scheduled on both): the same order, equal
        // times and ranks broken by the order they were given in. Times:
        // booked 3, 1, 2, 1 (ranks 1) and a later 1.0 (rank 1) and 2.0
        // (rank 0) scheduled after booking.
        let e = |i| Entity::from_raw_u32(i).unwrap();
        let booked = [
            (3.0, Event::TraceArrival(0)),
            (1.0, Event::TraceArrival(1)),
            (2.0, Event::TraceArrival(2)),
            (1.0, Event::TraceArrival(3)),
        ];
        let later = [
            (1.0, Event::NextTurn(e(5))),
            (2.0, Event::Phase(0)),
            (1.0, Event::StepEnd(e(6), 0)),
        ];
        let mut one_by_one = Agenda::default();
        for (t, ev) in booked.into_iter().chain(later) {
            one_by_one.schedule(t, ev);
        }
        let mut with_book = Agenda::default();
        with_book.book(booked);
        for (t, ev) in later {
            with_book.schedule(t, ev);
        }
        // Only the earliest booked event waits in the heap (the step end
        // waits with the step ends).
        assert_eq!((with_book.heap.len(), with_book.steps.len()), (3, 1));
        assert_eq!(with_book.booked.len(), 3);
        assert_eq!(with_book.len(), 7);
        let drain = |a: &mut Agenda| {
            let mut out = Vec::new();
            while let Some(t) = a.next_time() {
                while let Some(ev) = a.pop_at(t) {
                    out.push((t, ev));
                }
            }
            out
        };
        let expected = vec![
            (1.0, Event::TraceArrival(1)),
            (1.0, Event::TraceArrival(3)),
            (1.0, Event::NextTurn(e(5))),
            (1.0, Event::StepEnd(e(6), 0)),
            (2.0, Event::Phase(0)),
            (2.0, Event::TraceArrival(2)),
            (3.0, Event::TraceArrival(0)),
        ];
        assert_eq!(drain(&mut one_by_one), expected);
        assert_eq!(drain(&mut with_book), expected);
        assert!(with_book.is_empty());
    }

    #[test]
    fn step_ends_kept_apart_come_out_in_the_one_order() {
        // Events scheduled while others are popped, as a run does: each
        // pop must give the least (time, rank, insertion) of those waiting,
        // whichever of the two queues holds it. Times on a grid of 0.5 s
        // so that many are equal; the kinds cycle through ranks 1, 3, 4.
        let e = |i| Entity::from_raw_u32(i).unwrap();
        let mut agenda = Agenda::default();
        let mut waiting: Vec<(f64, u8, u32, Event)> = Vec::new();
        let mut popped = 0;
        for i in 0..400u32 {
            let time = (i / 4) as f64 * 0.5 + ((i * 7) % 5) as f64 * 0.5;
            let event = match i % 3 {
                0 => Event::StepEnd(e(i), i),
                1 => Event::NextTurn(e(i)),
                _ => Event::ReadStart(e(i)),
            };
            agenda.schedule(time, event);
            waiting.push((time, event.rank(), i, event));
            if i % 2 == 1 {
                let t = agenda.next_time().unwrap();
                let got = agenda.pop_at(t).unwrap();
                waiting.sort_by(|a, b| (a.0, a.1, a.2).partial_cmp(&(b.0, b.1, b.2)).unwrap());
                let want = waiting.remove(0);
                assert_eq!((t, got), (want.0, want.3), "pop {popped}");
                popped += 1;
            }
        }
        assert_eq!(agenda.len(), waiting.len());
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
