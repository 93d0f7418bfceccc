//! Faults a scenario schedules, and the client's retries (docs/faults.md).

use serde::{Deserialize, Serialize};

/// Something that goes wrong at `at` for `duration` simulated seconds.
/// Pods are named as the report names them: `prefill-0`, `decode-1`, …
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Fault {
    /// The pod is down: its running, queued and parked requests fail, its
    /// heartbeats stop, its KV is gone; it comes back empty.
    PodDown { pod: String, at: f64, duration: f64 },
    /// The pod's NICs run at `factor` of their rate.
    NicSlow {
        pod: String,
        at: f64,
        duration: f64,
        factor: f64,
    },
    /// Each heartbeat sent in the window is lost with `probability`.
    HeartbeatLoss {
        at: f64,
        duration: f64,
        probability: f64,
    },
    /// Each prefill answered in the window never reaches the sidecar with
    /// `probability`: no decode leg is sent, the lease waits for its expiry.
    PrefillAnswerLost {
        at: f64,
        duration: f64,
        probability: f64,
    },
}

impl Fault {
    /// When it starts and how long it lasts.
    pub fn window(&self) -> (f64, f64) {
        match self {
            Fault::PodDown { at, duration, .. }
            | Fault::NicSlow { at, duration, .. }
            | Fault::HeartbeatLoss { at, duration, .. }
            | Fault::PrefillAnswerLost { at, duration, .. } => (*at, *duration),
        }
    }

    /// Whether `t` falls in its window `[at, at + duration)`.
    pub fn covers(&self, t: f64) -> bool {
        let (at, d) = self.window();
        t >= at && t < at + d
    }
}

/// The client's behaviour when a request fails: re-send it up to `retries`
/// times, `backoff` seconds after each failure; a turn that still fails
/// ends its session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Client {
    #[serde(default)]
    pub retries: u32,
    #[serde(default)]
    pub backoff: f64,
}
