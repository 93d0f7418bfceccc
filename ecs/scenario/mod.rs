//! Scenarios: RON files → raw config (as written) → overrides (`--set`) →
//! validated [`Scenario`] the simulation uses.
//!
//! Every struct denies unknown fields, so a typo is an error naming the file,
//! line, column and field. `--set path=value` edits the raw config through a
//! JSON tree (which keeps enum names and exact f64s), then deserializes it
//! again, so an override is checked exactly like the file.
//!
//! | file | what |
//! |---|---|
//! | [`raw`] | the sections of a `.ron` file, parsed (errors name file, line, column, field) |
//! | [`params`] | script parameters |
//! | [`overrides`] | `--set path=value` |
//! | [`validate`] | script paths, plugin references, every number checked |
//! | [`pools`] | each pool's hardware, KV blocks, NICs and step-time model |
//! | [`workload`] | the workload section: session defaults, trace options |
//! | [`faults`] | scheduled faults and the client's retries |

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub mod faults;
pub mod overrides;
pub mod params;
pub mod pools;
pub mod raw;
pub mod validate;
pub mod workload;

pub use overrides::{TraceOptions, apply_override};
pub use params::ParamValue;
pub use pools::{CostPlan, LinearCost, PoolPlan};
pub use raw::*;
use validate::resolve_paths;
pub use validate::{expand_plugins, resolve};
pub use workload::Sessions;

/// The reference scenario's text, for unit tests.
#[cfg(test)]
pub(crate) const REFERENCE: &str = include_str!("../../scenarios/llmd_nixl_pull.ron");

/// A validated scenario, with paths resolved and every pool derived.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub raw: RawScenario,
    /// Where the file was read from (for messages).
    pub source: PathBuf,
    /// Shared rhai modules (`lib/` beside the scenario's folder), if any.
    pub lib_dir: Option<PathBuf>,
    /// Prefill's and decode's pools as the run uses them: hardware, KV
    /// blocks, NICs, step-time model (all derived numbers, for `pdsim check`).
    pub pools: [PoolPlan; 2],
}

impl Scenario {
    pub fn prefill(&self) -> &PoolPlan {
        &self.pools[0]
    }
    pub fn decode(&self) -> &PoolPlan {
        &self.pools[1]
    }
}

/// Reads, overrides, resolves and validates a scenario file.
pub fn load(path: &Path, overrides: &[String]) -> Result<Scenario> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::new(format!("cannot read scenario {}: {e}", path.display())))?;
    let mut raw = parse(&text, path)?;
    resolve_paths(&mut raw, path.parent().unwrap_or(Path::new(".")));
    for o in overrides {
        raw = apply_override(&raw, o)?;
    }
    resolve(raw, path)
}
