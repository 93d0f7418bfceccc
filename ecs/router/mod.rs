//! The gateway (docs/model.md §4): the llm-d router (decode profile → decider →
//! prefill profile, all rhai scripts) and the routing sidecar's serial
//! dispatch (prefill leg, wait for its answer, decode leg `from P[i]`).
//!
//! | file | what |
//! |---|---|
//! | [`gateway`] | the routing system: the pods' views, the profile handler |
//! | [`sidecar`] | the handoff system: prefill answers become leases and decode legs |
//! | [`book`] | the router's own bookkeeping (in-flight counts, approximate prefix index) |
//! | [`policy`] | the rhai policy host: plugins, hooks, the views scripts see |

pub mod book;
pub mod gateway;
pub mod policy;
pub mod sidecar;

use book::RouterBook;
use policy::{PodView, Policies};

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
    /// Pods (prefillers first) the router believes down: it learns of a
    /// failure or a recovery `detection_delay` after the fact.
    pub known_down: Vec<bool>,
    /// Scratch candidate views and their engines, reused across requests.
    pods: Vec<PodView>,
    candidates: Vec<bevy_ecs::entity::Entity>,
    prefill_pods: Vec<PodView>,
    prefill_candidates: Vec<bevy_ecs::entity::Entity>,
}

impl Router {
    pub fn new(mode: RouterMode, book: RouterBook) -> Router {
        Router {
            mode,
            book,
            decisions: 0,
            seconds: 0.0,
            known_down: Vec::new(),
            pods: Vec::new(),
            candidates: Vec::new(),
            prefill_pods: Vec::new(),
            prefill_candidates: Vec::new(),
        }
    }
}
