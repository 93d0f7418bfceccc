//! Mooncake JSONL: one request per line — `timestamp` (ms), `input_length`,
//! `output_length`, `hash_ids` — as in the Mooncake release; the multi-turn
//! form adds `session_id` and, on a session's later turns, `delay` (ms of
//! think time after the previous turn finished) instead of `timestamp`.

use serde::Deserialize;
use std::io::BufRead;
use std::path::Path;

use crate::error::{Error, Result};
use crate::workload::trace::Record;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    timestamp: Option<f64>,
    #[serde(default)]
    delay: Option<f64>,
    #[serde(default)]
    session_id: Option<serde_json::Value>,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Reads a Mooncake JSONL trace line by line, handing each record to
/// `take` until it returns false; errors name the file, line, column and
/// field.
pub fn read(
    mut reader: impl BufRead,
    path: &Path,
    mut take: impl FnMut(Record) -> Result<bool>,
) -> Result<()> {
    let file = path.display();
    let mut raw = String::new();
    let mut n = 0;
    loop {
        raw.clear();
        n += 1;
        let len = reader
            .read_line(&mut raw)
            .map_err(|e| Error::new(format!("{file}:{n}: cannot read: {e}")))?;
        if len == 0 {
            return Ok(());
        }
        if raw.trim().is_empty() {
            continue;
        }
        // A plain parse; only a line that fails it is parsed again with its
        // path tracked, for the error (tracking every element of
        // `hash_ids` cost a quarter more instructions on the peers trace).
        let parsed = Line::deserialize(&mut serde_json::Deserializer::from_str(&raw));
        let line = match parsed {
            Ok(line) => line,
            Err(_) => tracked_parse(&raw).map_err(|e| {
                let field = e.path().to_string();
                let inner = e.into_inner();
                let what = if field == "." {
                    String::new()
                } else {
                    format!(" field `{field}`:")
                };
                // serde_json names the line and column of the line itself.
                let msg = inner.to_string();
                let msg = msg.rfind(" at line ").map_or(msg.as_str(), |i| &msg[..i]);
                Error::new(format!(
                    "{file}:{n}:{}:{what} {msg} (a Mooncake line has timestamp, delay, session_id, \
                 input_length, output_length, hash_ids)",
                    inner.column()
                ))
            })?,
        };
        let bad =
            |field: &str, why: &str| Error::new(format!("{file}:{n}: field `{field}`: {why}"));
        for (field, v) in [("timestamp", line.timestamp), ("delay", line.delay)] {
            if let Some(v) = v
                && !(v.is_finite() && v >= 0.0)
            {
                return Err(bad(field, &format!("{v} is not a time in ms >= 0")));
            }
        }
        if line.input_length == 0 {
            return Err(bad("input_length", "a prompt has at least 1 token"));
        }
        if line.output_length == 0 {
            return Err(bad("output_length", "a request generates at least 1 token"));
        }
        let session = match line.session_id {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s),
            Some(v @ serde_json::Value::Number(_)) => Some(v.to_string()),
            Some(v) => {
                return Err(bad(
                    "session_id",
                    &format!("{v} is not a string or a number"),
                ));
            }
        };
        let more = take(Record {
            line: n,
            name: format!("line {n}"),
            session,
            timestamp: line.timestamp.map(|t| t / 1000.0),
            delay: line.delay.map(|d| d / 1000.0),
            input: line.input_length,
            output: line.output_length,
            hash_ids: Some(line.hash_ids),
        })?;
        if !more {
            return Ok(());
        }
    }
}

/// The line parsed with the path of each value tracked (the same parser,
/// so the same outcome as the plain parse, with the failing field named).
fn tracked_parse(
    raw: &str,
) -> std::result::Result<Line, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(raw))
}
