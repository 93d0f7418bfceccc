//! Requests given explicitly: trace workloads, replays and tests.
//!
//! A trace file is read into [`Record`]s (one per request, in file order)
//! by its format's reader — [`mooncake`], [`azure`], [`pdsim`] — then the
//! options are applied in this order: the time window, the first-N cut, the
//! time scaling; then each request gets its block identity ([`BlockPath`]):
//! Mooncake's `hash_ids` through [`identity::PathBuilder`], a pdsim
//! session's prompts as one stream, anything else a stream of its own.
//!
//! A session's first turn arrives at its timestamp (open loop); a later turn
//! with a `delay` is issued that long after the session's previous turn
//! finished (closed loop, as NVIDIA DynoSim reads Mooncake traces).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use crate::engine::BlockPath;
use crate::error::{Error, Result};
use crate::metrics::TraceSummary;
use crate::scenario::{TraceFormat, TraceSource};

pub mod azure;
pub mod identity;
pub mod mooncake;
pub mod pdsim;

/// Stream ids of requests that share nothing, far from every other stream.
pub const LONE_STREAMS: u64 = 1 << 40;

/// A request given explicitly.
#[derive(Debug, Clone)]
pub struct TraceRequest {
    /// Its id in the trace (replay reports name requests by it).
    pub name: String,
    /// When it reaches the gateway; None: a closed-loop turn, issued
    /// `delay` seconds after its session's previous turn finished.
    pub arrival: Option<f64>,
    pub delay: f64,
    /// Its session's next turn (closed loop), by index in the trace.
    pub next: Option<u32>,
    /// The session it belongs to, as policies see it (None: its own).
    pub session: Option<u64>,
    pub prompt: u32,
    pub output: u32,
    /// The identity of its tokens; None: a stream of its own (shares nothing).
    pub path: Option<BlockPath>,
    /// Without a router (direct mode): prefill on prefiller 0?
    pub remote: bool,
}

impl TraceRequest {
    /// A request arriving at `arrival`, on `stream` (None: its own).
    pub fn at(arrival: f64, prompt: u32, output: u32, stream: Option<u64>) -> TraceRequest {
        TraceRequest {
            name: String::new(),
            arrival: Some(arrival),
            delay: 0.0,
            next: None,
            session: stream,
            prompt,
            output,
            path: stream.map(BlockPath::stream),
            remote: false,
        }
    }
}

/// One request as a trace file gives it, before the options apply.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// 1-based line of the file (for messages).
    pub line: usize,
    pub name: String,
    pub session: Option<String>,
    /// Seconds, the trace's own clock.
    pub timestamp: Option<f64>,
    /// Seconds after the session's previous turn finished.
    pub delay: Option<f64>,
    pub input: u32,
    pub output: u32,
    /// Mooncake: one id per `block_tokens` prompt tokens.
    pub hash_ids: Option<Vec<u64>>,
}

/// A trace read and prepared for a run.
#[derive(Debug, Clone)]
pub struct Trace {
    pub requests: Vec<TraceRequest>,
    pub summary: TraceSummary,
}

/// A trace read once and shared by the runs that replay it.
#[derive(Debug, Clone)]
pub struct SharedTrace {
    pub requests: Arc<[TraceRequest]>,
    pub summary: TraceSummary,
}

/// The traces a sweep has read: its runs (and the check of each grid point
/// before them) replay the same file with the same options, and reading it
/// is a large part of a run (a fifth of a whole run of the peers' 60
/// k-request trace, more of a shorter one).
/// Each file is read once per sweep, by the first run that asks, the others
/// waiting for it: a file changed during the sweep is not read again, so
/// every run replays the same requests.
#[derive(Default)]
pub struct TraceReads {
    read: Mutex<Vec<ReadTrace>>,
}

struct ReadTrace {
    source: TraceSource,
    trace: Arc<Mutex<Option<SharedTrace>>>,
}

/// How many traces [`TraceReads`] keeps (the oldest is dropped, and freed
/// once no run holds it): two, for a grid over a trace option run two at a
/// time, with memory bounded whatever the grid.
const KEPT: usize = 2;

impl TraceReads {
    /// [`load`], once for the same options.
    pub fn load(&self, source: &TraceSource) -> Result<SharedTrace> {
        let cell = {
            let mut read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
            match read.iter().find(|t| t.source == *source) {
                Some(t) => t.trace.clone(),
                None => {
                    if read.len() >= KEPT {
                        read.remove(0);
                    }
                    let trace = Arc::new(Mutex::new(None));
                    read.push(ReadTrace {
                        source: source.clone(),
                        trace: trace.clone(),
                    });
                    trace
                }
            }
        };
        let mut slot = cell.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = &*slot {
            return Ok(t.clone());
        }
        // An error is not kept: the next run reads the file again and says so.
        let t = SharedTrace::from(load(source)?);
        *slot = Some(t.clone());
        Ok(t)
    }
}

impl From<Trace> for SharedTrace {
    fn from(t: Trace) -> SharedTrace {
        SharedTrace {
            requests: t.requests.into(),
            summary: t.summary,
        }
    }
}

/// Reads the trace of a scenario's workload section, line by line (a
/// request's hash ids are turned into its identity as it is read, and not
/// kept).
pub fn load(source: &TraceSource) -> Result<Trace> {
    let path = Path::new(&source.file);
    let file = std::fs::File::open(path)
        .map_err(|e| Error::new(format!("cannot read trace {}: {e}", path.display())))?;
    // 256 KiB at a time, not BufReader's 8: a trace of the peers' size is
    // 185 MB, and the read calls' own cost was a tenth of reading it
    // (docs/performance.md).
    let mut reader = std::io::BufReader::with_capacity(1 << 18, file);
    let format = match source.format {
        Some(f) => f,
        None => {
            let head = peek_line(&mut reader)
                .map_err(|e| Error::new(format!("cannot read trace {}: {e}", path.display())))?;
            guess_format(&head).ok_or_else(|| {
                Error::new(format!(
                    "{}: cannot tell the trace format (not Mooncake JSONL, Azure CSV or a pdsim trace): \
                     give workload.trace.format (or --trace-format)",
                    path.display()
                ))
            })?
        }
    };
    let mut prep = Preparer::new(format, source, path);
    match format {
        TraceFormat::Mooncake => mooncake::read(reader, path, |r| prep.push(r))?,
        TraceFormat::Azure => {
            for r in azure::read(&read_all(reader, path)?, path)? {
                if !prep.push(r)? {
                    break;
                }
            }
        }
        TraceFormat::Pdsim => {
            for r in pdsim::records(pdsim::read(&read_all(reader, path)?, path)?) {
                if !prep.push(r)? {
                    break;
                }
            }
        }
    }
    Ok(prep.finish())
}

/// The first non-empty line, left in the reader's buffer.
fn peek_line(reader: &mut impl std::io::BufRead) -> std::io::Result<String> {
    let buf = reader.fill_buf()?;
    let text = String::from_utf8_lossy(buf);
    Ok(text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string())
}

fn read_all(mut reader: impl std::io::Read, path: &Path) -> Result<String> {
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|e| Error::new(format!("cannot read trace {}: {e}", path.display())))?;
    Ok(text)
}

/// The format a trace's first line looks like.
pub fn guess_format(first: &str) -> Option<TraceFormat> {
    let first = first.trim();
    if first.starts_with('{') {
        // Mooncake has a request object per line; a pdsim trace is one
        // (pretty-printed) object with `config` and `requests`.
        return if first.contains("\"input_length\"") {
            Some(TraceFormat::Mooncake)
        } else {
            Some(TraceFormat::Pdsim)
        };
    }
    first
        .split(',')
        .any(|c| c.trim() == "TIMESTAMP")
        .then_some(TraceFormat::Azure)
}

/// Applies the options to records as they are read (the window, the
/// first-N cut, the time scaling) and gives each request its identity and
/// its place in its session.
pub struct Preparer<'a> {
    format: TraceFormat,
    source: &'a TraceSource,
    file: String,
    builder: identity::PathBuilder,
    /// Per session: (its id, whether the window keeps it, its last turn kept).
    sessions: HashMap<String, (u64, bool, Option<usize>)>,
    /// Pdsim traces: per session id, the tokens of its stream requests so
    /// far covered (prompt + output).
    stream_seen: HashMap<u64, u32>,
    out: Vec<TraceRequest>,
    left_out: u64,
    cut: bool,
    input: u64,
    output: u64,
    seen: u64,
    t_min: f64,
    t_max: f64,
}

impl<'a> Preparer<'a> {
    pub fn new(format: TraceFormat, source: &'a TraceSource, path: &Path) -> Preparer<'a> {
        Preparer {
            format,
            source,
            file: path.display().to_string(),
            builder: identity::PathBuilder::new(source.block_tokens),
            sessions: HashMap::new(),
            stream_seen: HashMap::new(),
            out: Vec::new(),
            left_out: 0,
            cut: false,
            input: 0,
            output: 0,
            seen: 0,
            t_min: f64::INFINITY,
            t_max: f64::NEG_INFINITY,
        }
    }

    /// Takes the next record of the file; returns false once the first-N
    /// cut is reached (nothing more is wanted).
    pub fn push(&mut self, r: Record) -> Result<bool> {
        if self
            .source
            .max_requests
            .is_some_and(|n| self.out.len() as u64 >= n)
        {
            self.cut = true;
            return Ok(false);
        }
        let i = self.out.len();
        let lone = LONE_STREAMS + i as u64;
        let in_window = |t: f64| self.source.window.is_none_or(|(a, b)| (a..b).contains(&t));
        // A session's first line decides the window for all its turns.
        let (session, prev) = match &r.session {
            None => {
                let t = self.timestamp(&r)?;
                if !in_window(t) {
                    self.left_out += 1;
                    return Ok(true);
                }
                (lone, None)
            }
            Some(name) => match self.sessions.get(name) {
                Some(&(_, false, _)) => {
                    self.left_out += 1;
                    return Ok(true);
                }
                Some(&(id, true, prev)) => (id, prev),
                None => {
                    let t = self.timestamp(&r)?;
                    let keep = in_window(t);
                    let id = self.sessions.len() as u64;
                    self.sessions.insert(name.clone(), (id, keep, None));
                    if !keep {
                        self.left_out += 1;
                        return Ok(true);
                    }
                    (id, None)
                }
            },
        };
        // A later turn with a delay waits for the previous turn (closed
        // loop); one with only a timestamp arrives then.
        let closed = prev.is_some() && r.delay.is_some();
        let arrival = if closed {
            if let Some(p) = prev {
                self.out[p].next = Some(i as u32);
            }
            None
        } else {
            let start = self.source.window.map_or(0.0, |w| w.0);
            let t = (self.timestamp(&r)? - start) / (self.source.speedup * self.source.rate_scale);
            self.t_min = self.t_min.min(t);
            self.t_max = self.t_max.max(t);
            Some(t)
        };
        if let Some(name) = &r.session {
            self.sessions.get_mut(name).expect("inserted above").2 = Some(i);
        }
        let path = match (&r.hash_ids, self.format) {
            (Some(ids), _) => {
                let (path, seen) = self.builder.path(ids, r.input, lone).map_err(|e| {
                    // (Only Mooncake lines have hash ids.)
                    let path = Path::new(&self.file);
                    let at = mooncake::value_column_in_file(path, r.line, "hash_ids")
                        .map_or(String::new(), |c| format!("{c}:"));
                    Error::new(format!("{}:{}:{at} {e}", self.file, r.line))
                })?;
                self.seen += seen as u64;
                Some(path)
            }
            (None, TraceFormat::Pdsim) if r.session.is_some() => {
                let covered = self.stream_seen.entry(session).or_insert(0);
                self.seen += r.input.min(*covered) as u64;
                // (Saturating: a stream past 2^32 tokens covers any prompt.)
                *covered = (*covered).max(r.input.saturating_add(r.output));
                Some(BlockPath::stream(session))
            }
            (None, _) => None,
        };
        self.input += r.input as u64;
        self.output += r.output as u64;
        self.out.push(TraceRequest {
            name: r.name,
            arrival,
            delay: r.delay.unwrap_or(0.0) / self.source.speedup,
            next: None,
            session: Some(session),
            prompt: r.input,
            output: r.output,
            path,
            remote: false,
        });
        Ok(true)
    }

    fn timestamp(&self, r: &Record) -> Result<f64> {
        r.timestamp.ok_or_else(|| {
            Error::new(format!(
                "{}:{}: `timestamp` is missing (a session's first turn, or a request without a session, needs one)",
                self.file, r.line
            ))
        })
    }

    pub fn finish(self) -> Trace {
        let n = self.out.len() as u64;
        let lone = self
            .out
            .iter()
            .filter(|r| r.session >= Some(LONE_STREAMS))
            .count();
        let kept_sessions = self.sessions.values().filter(|s| s.1).count();
        let summary = TraceSummary {
            file: self.source.file.clone(),
            format: format!("{:?}", self.format),
            requests: n,
            sessions: (kept_sessions + lone) as u64,
            left_out: self.left_out,
            cut: self.cut,
            span: if self.t_max >= self.t_min {
                self.t_max - self.t_min
            } else {
                0.0
            },
            mean_input: self.input as f64 / n.max(1) as f64,
            mean_output: self.output as f64 / n.max(1) as f64,
            seen_before: self.seen as f64 / self.input.max(1) as f64,
        };
        Trace {
            requests: self.out,
            summary,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(file: &Path, speedup: f64) -> TraceSource {
        TraceSource {
            file: file.display().to_string(),
            format: None,
            block_tokens: 16,
            speedup,
            rate_scale: 1.0,
            window: None,
            max_requests: None,
        }
    }

    #[test]
    fn a_sweep_reads_each_trace_once_and_keeps_two() {
        let dir = std::env::temp_dir().join(format!("pdsim-reads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("two.jsonl");
        let reads = TraceReads::default();
        // Not there yet: the error is load's, and it is not kept.
        let e = reads.load(&source(&file, 1.0)).unwrap_err().to_string();
        assert!(e.starts_with("cannot read trace"), "{e}");
        std::fs::write(
            &file,
            "{\"timestamp\":0,\"input_length\":32,\"output_length\":2,\"hash_ids\":[1,2]}\n\
             {\"timestamp\":5,\"input_length\":16,\"output_length\":1,\"hash_ids\":[1]}\n",
        )
        .unwrap();
        let first = reads.load(&source(&file, 1.0)).unwrap();
        assert_eq!(first.requests.len(), 2);
        assert_eq!(first.requests[1].arrival, Some(0.005)); // 5 ms
        // The same options: the same requests, not read again.
        let again = reads.load(&source(&file, 1.0)).unwrap();
        assert!(Arc::ptr_eq(&first.requests, &again.requests));
        // Other options (a speed-up) are another read; a third drops the oldest (two
        // kept), which is then read anew: equal, but not the same memory.
        let other = reads.load(&source(&file, 2.0)).unwrap();
        assert!(!Arc::ptr_eq(&first.requests, &other.requests));
        reads.load(&source(&file, 4.0)).unwrap();
        let reread = reads.load(&source(&file, 1.0)).unwrap();
        assert!(!Arc::ptr_eq(&first.requests, &reread.requests));
        assert_eq!(reread.summary, first.summary);
        // Speed-ups 4 (kept) and 1 (read anew): 2 was dropped when 1 came back.
        let kept = reads.load(&source(&file, 4.0)).unwrap();
        let kept_again = reads.load(&source(&file, 4.0)).unwrap();
        assert!(Arc::ptr_eq(&kept.requests, &kept_again.requests));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
