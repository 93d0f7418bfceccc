//! Hot swap: a phase that starts now edits the scenario (as `--set` would)
//! and the router's policies and the workload take the edited values.

use bevy_ecs::prelude::*;

use crate::error::Error;
use crate::router::{Router, RouterMode};
use crate::scenario;
use crate::shared::{CurrentScenario, PhaseIndex, RunStatus, TickEvents};
use crate::workload::WorkloadState;

/// System: a phase starts: apply its changes to the scenario, then to the
/// router's policies and the workload.
#[allow(clippy::too_many_arguments)]
pub fn phase_system(
    events: Res<TickEvents>,
    mut current: ResMut<CurrentScenario>,
    mut router: NonSendMut<Router>,
    mut workload: ResMut<WorkloadState>,
    mut phase: ResMut<PhaseIndex>,
    mut status: ResMut<RunStatus>,
) {
    for &i in &events.phases {
        let changes = current.0.phases[i as usize].set.clone();
        let mut raw = current.0.clone();
        for (path, value) in &changes {
            match scenario::apply_override(&raw, &format!("{path}={value}")) {
                Ok(r) => raw = r,
                Err(e) => {
                    status.error = Some(Error::new(format!(
                        "phase {} (at t={}): {e}",
                        i + 1,
                        raw.phases[i as usize].at
                    )));
                    return;
                }
            }
        }
        if let RouterMode::Scripts(p) = &mut router.mode
            && let Err(e) = scenario::expand_plugins(&raw.router).and_then(|r| p.reload(&r))
        {
            status.error = Some(e);
            return;
        }
        workload.params = scenario::Sessions::of(&raw.workload);
        current.0 = raw;
        phase.0 = i + 1;
    }
}
