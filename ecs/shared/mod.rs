//! What every system shares: simulated time, the agenda of future events,
//! the events due in this tick, and the queues that hand requests from one
//! system to the next within a tick. This module imports no system; every
//! other part of the simulation may depend on it.

pub mod agenda;
pub mod deadlines;
pub mod joining;
pub mod resources;

pub use agenda::{Agenda, Event};
pub use deadlines::{DeadlineKey, Deadlines};
pub use joining::{Joining, Lookup, WithJoining};
pub use resources::*;
