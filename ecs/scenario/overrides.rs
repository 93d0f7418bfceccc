//! `--set path=value`: edits the raw scenario through a JSON tree (which
//! keeps enum names and exact f64s), then deserializes it again, so an
//! override is checked exactly like the file.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::scenario::{RawScenario, TraceFormat};

/// Applies one `path=value` override. The value is read as JSON when it
/// parses as JSON (numbers, booleans, quoted strings, lists), as ±infinity
/// when it says `inf`, and as a bare string otherwise (script paths, enum
/// variant names). A script, trace, step table, model or GPU file is a
/// path relative to the current directory.
pub fn apply_override(raw: &RawScenario, assignment: &str) -> Result<RawScenario> {
    let (path, value) = assignment.split_once('=').ok_or_else(|| {
        Error::new(format!(
            "--set {assignment}: expected PATH=VALUE, e.g. decode.engine.num_gpu_blocks=2000"
        ))
    })?;
    let mut tree = serde_json::to_value(raw).expect("a scenario always serializes");
    let new_value = parse_override_value(path, value);
    set_path(&mut tree, path, new_value)
        .map_err(|m| Error::new(format!("--set {assignment}: {m}")))?;
    serde_path_to_error::deserialize(tree).map_err(|e| {
        let path = e.path().to_string();
        Error::new(format!(
            "--set {assignment}: in field `{path}`: {}",
            e.into_inner()
        ))
    })
}

fn parse_override_value(path: &str, value: &str) -> serde_json::Value {
    let v = value.trim();
    let is_file = path == "script"
        || path.ends_with(".script")
        || path == "workload.trace.file"
        || path.ends_with(".cost.file")
        || ((path.ends_with(".model") || path.ends_with(".gpu"))
            && crate::hardware::presets::is_path(v));
    if is_file {
        let p = Path::new(v);
        let abs = if p.is_relative() {
            std::env::current_dir()
                .map(|d| d.join(p))
                .unwrap_or(p.to_path_buf())
        } else {
            p.to_path_buf()
        };
        return serde_json::Value::String(abs.to_string_lossy().into_owned());
    }
    match v {
        "inf" | "+inf" | "infinity" => return serde_json::Value::String("inf".into()),
        "-inf" | "-infinity" => return serde_json::Value::String("-inf".into()),
        _ => {}
    }
    // A RON tuple, as the scenario file writes it: `(1000, 3000)`.
    let tuple = v
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .map(|t| format!("[{t}]"));
    serde_json::from_str(v)
        .or_else(|e| tuple.map_or(Err(e), |t| serde_json::from_str(&t)))
        .unwrap_or_else(|_| serde_json::Value::String(v.to_string()))
}

/// Walks `tree` along a dotted path (list items by index) and replaces the
/// value there. Only script parameter maps may gain new keys.
fn set_path(
    tree: &mut serde_json::Value,
    path: &str,
    value: serde_json::Value,
) -> std::result::Result<(), String> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut node = tree;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let in_params = i > 0 && parts[i - 1] == "params";
        node = match node {
            serde_json::Value::Object(map) => {
                if !map.contains_key(*part) {
                    if !(in_params || is_params_map(&parts[..i])) {
                        let known: Vec<&String> = map.keys().collect();
                        return Err(format!(
                            "no field `{part}` {}; the fields there are {}",
                            if i == 0 {
                                "at the top level".to_string()
                            } else {
                                format!("in `{}`", parts[..i].join("."))
                            },
                            known
                                .iter()
                                .map(|k| format!("`{k}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                    if !last {
                        map.insert(
                            part.to_string(),
                            serde_json::Value::Object(Default::default()),
                        );
                    }
                }
                if last {
                    map.insert(part.to_string(), value);
                    return Ok(());
                }
                map.get_mut(*part).expect("inserted above")
            }
            serde_json::Value::Array(items) => {
                let idx: usize = part.parse().map_err(|_| {
                    format!(
                        "`{}` is a list: expected an index, found `{part}`",
                        parts[..i].join(".")
                    )
                })?;
                let len = items.len();
                let item = items.get_mut(idx).ok_or_else(|| {
                    format!("`{}` has {len} items: no index {idx}", parts[..i].join("."))
                })?;
                if last {
                    *item = value;
                    return Ok(());
                }
                item
            }
            _ => {
                return Err(format!(
                    "`{}` is a value, not a section",
                    parts[..i].join(".")
                ));
            }
        };
    }
    Err("empty path".into())
}

fn is_params_map(parts_before: &[&str]) -> bool {
    parts_before.last() == Some(&"params")
}

/// Replaying a trace instead of the scenario's workload.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TraceOptions {
    /// Replay this trace instead of the scenario's workload (Mooncake JSONL,
    /// Azure CSV or a pdsim trace; docs/traces.md). Its options are
    /// `--set workload.trace.block_tokens=16` and so on.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// The trace's format (default: guessed from its content).
    #[arg(long, value_name = "FORMAT", requires = "trace", value_parser = parse_format)]
    pub trace_format: Option<TraceFormat>,
}

impl TraceOptions {
    /// The override that makes the workload this trace (first, so that
    /// `--set workload.trace.…` can refine it).
    pub fn override_(&self) -> Option<String> {
        let file = self.trace.as_ref()?;
        let file = std::path::absolute(file).unwrap_or(file.clone());
        let mut trace = serde_json::json!({"file": file.to_string_lossy()});
        if let Some(f) = self.trace_format {
            trace["format"] = format!("{f:?}").into();
        }
        Some(format!(
            "workload={}",
            serde_json::json!({ "trace": trace })
        ))
    }
}

fn parse_format(s: &str) -> std::result::Result<TraceFormat, String> {
    match s.to_ascii_lowercase().as_str() {
        "mooncake" => Ok(TraceFormat::Mooncake),
        "azure" => Ok(TraceFormat::Azure),
        "pdsim" => Ok(TraceFormat::Pdsim),
        _ => Err(format!(
            "`{s}` is not a trace format: mooncake, azure or pdsim"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::REFERENCE;
    use crate::scenario::{ParamValue, TransferMode, parse};

    #[test]
    fn overrides_reach_nested_fields_params_and_infinity() {
        let raw = parse(REFERENCE, Path::new("ref.ron")).unwrap();
        let raw = apply_override(&raw, "decode.engine.num_gpu_blocks=2000").unwrap();
        assert_eq!(raw.decode.engine.num_gpu_blocks, Some(2000));
        let raw = apply_override(&raw, "router.decider.params.non_cached_tokens=inf").unwrap();
        assert_eq!(
            raw.router.decider.params["non_cached_tokens"],
            ParamValue::Float(f64::INFINITY)
        );
        let raw = apply_override(&raw, "transfer.mode=StoreAndForward").unwrap();
        assert_eq!(raw.transfer.mode, TransferMode::StoreAndForward);
        let raw = apply_override(&raw, "workload.session_rate=1.2").unwrap();
        assert_eq!(raw.workload.session_rate, Some(1.2));
        let raw = apply_override(&raw, "router.decode.scorers.0.weight=2.5").unwrap();
        assert_eq!(raw.router.decode.scorers[0].weight, 2.5);
    }

    #[test]
    fn a_bad_override_says_what_is_wrong() {
        let raw = parse(REFERENCE, Path::new("ref.ron")).unwrap();
        let err = apply_override(&raw, "decode.engine.num_gpu_blokcs=5")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no field `num_gpu_blokcs`") && err.contains("num_gpu_blocks"),
            "{err}"
        );
        let err = apply_override(&raw, "decode.engine.num_gpu_blocks=lots")
            .unwrap_err()
            .to_string();
        assert!(err.contains("decode.engine.num_gpu_blocks"), "{err}");
        let err = apply_override(&raw, "seed").unwrap_err().to_string();
        assert!(err.contains("PATH=VALUE"), "{err}");
    }
}
