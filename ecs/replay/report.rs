//! The oracle's report format (docs/oracle.md): per engine, one line per
//! request and per step; and the comparison of two such reports.

use serde_json::Value;
use std::fmt::Write as _;

use crate::replay::trace::Mode;

/// One engine's step, as the oracle reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub step: usize,
    pub start: f64,
    pub end: f64,
    pub scheduled: Vec<(String, u32)>,
    pub preempted: Vec<String>,
    pub kv_blocks_held: u32,
}

/// One request on one engine, as the oracle reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRow {
    pub id: String,
    pub arrival_time: f64,
    pub first_scheduled_step: Option<usize>,
    pub prefix_hit: Option<u32>,
    pub first_token_step: Option<usize>,
    pub first_token_time: Option<f64>,
    pub finish_step: Option<usize>,
    pub finish_time: Option<f64>,
    pub preemptions: u32,
    /// Decoder, pd mode.
    pub remote: Option<RemoteRow>,
    /// Refused at arrival: its prompt reaches max_model_len.
    pub refused: bool,
}

/// A decode leg's read (pd mode): parked by the `schedule()` at
/// `parked_time`, `remote_tokens` read from `read_start = parked_time + x0`
/// until `read_done`.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteRow {
    pub parked_time: f64,
    pub remote_tokens: u32,
    pub read_start: f64,
    pub read_done: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EngineReport {
    pub requests: Vec<RequestRow>,
    pub steps: Vec<StepRow>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    pub mode: Mode,
    /// Single mode: the engine; pd mode: the decoder.
    pub decode: EngineReport,
    /// pd mode: the prefiller.
    pub prefill: Option<EngineReport>,
    /// The read latency (pd mode).
    pub x0: f64,
}

fn num(x: f64) -> String {
    // As the oracle: rounded to 1e-12 s.
    let r = (x * 1e12).round() / 1e12;
    let v = serde_json::Number::from_f64(r)
        .map(Value::Number)
        .unwrap_or(Value::Null);
    v.to_string()
}

fn opt<T: ToString>(x: Option<T>) -> String {
    x.map_or("null".to_string(), |v| v.to_string())
}

fn opt_num(x: Option<f64>) -> String {
    x.map_or("null".to_string(), num)
}

fn quoted(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

impl EngineReport {
    fn write(&self, out: &mut String, indent: usize) {
        let pad = " ".repeat(indent);
        let rows: Vec<String> = self
            .requests
            .iter()
            .map(|r| {
                let mut line = format!(
                    "{{\"id\": {}, \"arrival_time\": {}, \"first_scheduled_step\": {}, \"prefix_hit\": {}, \
                     \"first_token_step\": {}, \"first_token_time\": {}, \"finish_step\": {}, \
                     \"finish_time\": {}, \"preemptions\": {}",
                    quoted(&r.id),
                    num(r.arrival_time),
                    opt(r.first_scheduled_step),
                    opt(r.prefix_hit),
                    opt(r.first_token_step),
                    opt_num(r.first_token_time),
                    opt(r.finish_step),
                    opt_num(r.finish_time),
                    r.preemptions
                );
                if let Some(x) = &r.remote {
                    let _ = write!(
                        line,
                        ", \"parked_time\": {}, \"remote_tokens\": {}, \"read_start\": {}, \"read_done\": {}",
                        num(x.parked_time),
                        x.remote_tokens,
                        num(x.read_start),
                        opt_num(x.read_done)
                    );
                }
                if r.refused {
                    line.push_str(", \"refused\": true");
                }
                line.push('}');
                line
            })
            .collect();
        let _ = write!(
            out,
            "{pad}\"requests\": [\n{pad}  {}\n{pad}],\n",
            rows.join(&format!(",\n{pad}  "))
        );
        let rows: Vec<String> = self
            .steps
            .iter()
            .map(|s| {
                let sched: Vec<String> = s
                    .scheduled
                    .iter()
                    .map(|(id, n)| format!("[{}, {n}]", quoted(id)))
                    .collect();
                let pre: Vec<String> = s.preempted.iter().map(|id| quoted(id)).collect();
                format!(
                    "{{\"step\": {}, \"start\": {}, \"end\": {}, \"scheduled\": [{}], \"preempted\": [{}], \"kv_blocks_held\": {}}}",
                    s.step,
                    num(s.start),
                    num(s.end),
                    sched.join(", "),
                    pre.join(", "),
                    s.kv_blocks_held
                )
            })
            .collect();
        let _ = write!(
            out,
            "{pad}\"steps\": [\n{pad}  {}\n{pad}]",
            rows.join(&format!(",\n{pad}  "))
        );
    }
}

impl ReplayReport {
    /// The report as the oracle writes it: one line per request and per step.
    pub fn to_json_text(&self) -> String {
        let mut out = String::new();
        match &self.prefill {
            None => {
                out.push_str("{\n \"mode\": \"single\",\n");
                self.decode.write(&mut out, 1);
                out.push_str("\n}\n");
            }
            Some(p) => {
                out.push_str("{\n \"mode\": \"pd\",\n \"prefill\": {\n");
                p.write(&mut out, 2);
                out.push_str("\n },\n \"decode\": {\n");
                self.decode.write(&mut out, 2);
                out.push_str("\n }\n}\n");
            }
        }
        out
    }
}

impl ReplayReport {
    /// The report as a JSON tree (the oracle's shape).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.to_json_text()).expect("the report is valid JSON")
    }
}

/// Differences between two reports of the oracle's shape (`ours`, `theirs`):
/// ids, counts, steps, schedules and preemptions exactly, times within `tol`
/// seconds. Requests are matched by id. Empty when they agree.
pub fn compare(ours: &Value, theirs: &Value, tol: f64) -> Vec<String> {
    let mut diffs = Vec::new();
    if ours["mode"] != theirs["mode"] {
        diffs.push(format!("mode: {} vs {}", ours["mode"], theirs["mode"]));
        return diffs;
    }
    let sections: Vec<(&str, &Value, &Value)> = if ours["mode"] == "pd" {
        vec![
            ("prefill", &ours["prefill"], &theirs["prefill"]),
            ("decode", &ours["decode"], &theirs["decode"]),
        ]
    } else {
        vec![("engine", ours, theirs)]
    };
    for (what, a, b) in sections {
        compare_section(what, a, b, tol, &mut diffs);
    }
    diffs
}

fn same(a: &Value, b: &Value, tol: f64) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() <= tol
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q, tol))
        }
        _ => a == b,
    }
}

fn compare_section(what: &str, a: &Value, b: &Value, tol: f64, diffs: &mut Vec<String>) {
    let empty = Vec::new();
    let (sa, sb) = (
        a["steps"].as_array().unwrap_or(&empty),
        b["steps"].as_array().unwrap_or(&empty),
    );
    for (i, (x, y)) in sa.iter().zip(sb).enumerate() {
        for key in ["start", "end", "scheduled", "preempted", "kv_blocks_held"] {
            if !same(&x[key], &y[key], tol) {
                diffs.push(format!(
                    "{what} step {i} {key}: ours {} vs theirs {}",
                    x[key], y[key]
                ));
            }
        }
    }
    if sa.len() != sb.len() {
        diffs.push(format!(
            "{what}: {} steps in ours vs {} in theirs",
            sa.len(),
            sb.len()
        ));
    }
    let (ra, rb) = (
        a["requests"].as_array().unwrap_or(&empty),
        b["requests"].as_array().unwrap_or(&empty),
    );
    for y in rb {
        let id = &y["id"];
        let Some(x) = ra.iter().find(|x| &x["id"] == id) else {
            diffs.push(format!("{what} request {id}: missing in ours"));
            continue;
        };
        let keys = y.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
        for key in keys.unwrap_or_default() {
            if !same(&x[&key], &y[&key], tol) {
                diffs.push(format!(
                    "{what} request {id} {key}: ours {} vs theirs {}",
                    x[&key], y[&key]
                ));
            }
        }
    }
    for x in ra {
        if !rb.iter().any(|y| y["id"] == x["id"]) {
            diffs.push(format!("{what} request {}: not in theirs", x["id"]));
        }
    }
}
