//! pdsim's replay trace (docs/oracle.md, "Trace format"): one JSON object
//! with `config` (used by `pdsim replay`) and `requests`, each with `id`,
//! `arrival_time` (s), `prompt_len`, `output_len` and an optional `session`
//! (a session's prompts are prefixes of one token stream). `pdsim run`
//! reads the requests and routes them through the scenario's deployment.

use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::scenario::validate::MAX_HORIZON;
use crate::workload::trace::Record;

/// One request of the trace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub id: String,
    pub arrival_time: f64,
    pub prompt_len: u32,
    pub output_len: u32,
    #[serde(default)]
    pub session: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    #[allow(dead_code)] // read by `pdsim replay`, not by a run
    config: serde_json::Value,
    requests: Vec<Entry>,
}

/// The trace's requests, checked: ids unique, arrivals finite, >= 0 and
/// within the longest horizon,
/// prompt and output at least one token.
pub fn check(requests: &[Entry]) -> Result<()> {
    let mut ids: HashMap<&str, ()> = HashMap::new();
    for r in requests {
        if ids.insert(r.id.as_str(), ()).is_some() {
            return Err(Error::new(format!("request id {:?} appears twice", r.id)));
        }
        if !(r.arrival_time.is_finite() && r.arrival_time >= 0.0) {
            return Err(Error::new(format!(
                "request {:?}: arrival_time must be a finite number >= 0",
                r.id
            )));
        }
        if r.arrival_time > MAX_HORIZON {
            return Err(Error::new(format!(
                "request {:?}: arrival_time {} s is past the longest run pdsim simulates ({MAX_HORIZON:e} s, \
                 about 32 years); is it in milliseconds or an absolute timestamp?",
                r.id,
                crate::error::num(r.arrival_time)
            )));
        }
        if r.prompt_len == 0 || r.output_len == 0 {
            return Err(Error::new(format!(
                "request {:?}: prompt_len and output_len must be at least 1",
                r.id
            )));
        }
    }
    Ok(())
}

/// The requests of a pdsim trace's text, checked.
pub fn read(text: &str, path: &Path) -> Result<Vec<Entry>> {
    let file: File = serde_json::from_str(text)
        .map_err(|e| Error::new(format!("{}: not a pdsim trace: {e}", path.display())))?;
    check(&file.requests).map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
    Ok(file.requests)
}

/// The trace's requests as records (open loop, at their arrival times).
pub fn records(requests: Vec<Entry>) -> Vec<Record> {
    requests
        .into_iter()
        .map(|r| Record {
            line: 0,
            name: r.id,
            session: r.session,
            timestamp: Some(r.arrival_time),
            delay: None,
            input: r.prompt_len,
            output: r.output_len,
            hash_ids: None,
        })
        .collect()
}
