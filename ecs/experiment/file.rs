//! Experiment files: a base scenario and the sweep to run over it (RON).

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::files::{parse_ron, ron_options};

/// An experiment file (RON): a base scenario and the sweep to run over it.
///
/// ```ron
/// (
///     name: "deciders",                 // default out dir: out/deciders
///     scenario: "../llmd_nixl_pull.ron", // relative to this file
///     seeds: "1..20",                   // as --seeds
///     horizon: 10000.0,                 // optional: else the scenario's
///     warmup: 1000.0,                   // optional: else the scenario's
///     set: {"workload.session_rate": 0.6},  // optional, as --set
///     grid: [                           // optional, as --grid, in order
///         ("router.decider.params.non_cached_tokens", [1, 512, 2048, inf]),
///     ],
/// )
/// ```
///
/// Values may be numbers, `inf`, booleans or strings (enum variants and
/// script paths as strings); they are passed on as `--set` would pass them.
/// `set` is applied in the order of its paths, then `--set` flags; `--grid`
/// flags add axes after the file's; `--seeds`, `--horizon` and `--warmup`
/// replace the file's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub name: String,
    pub scenario: String,
    pub seeds: String,
    #[serde(default)]
    pub horizon: Option<f64>,
    #[serde(default)]
    pub warmup: Option<f64>,
    #[serde(default)]
    pub set: BTreeMap<String, Value>,
    #[serde(default)]
    pub grid: Vec<(String, Vec<Value>)>,
}

/// A scalar of an experiment file, kept as the text `--set` would take.
#[derive(Debug, Clone, PartialEq)]
pub struct Value(pub String);

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Value;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number, inf, a bool or a string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Value, E> {
                Ok(Value(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Value, E> {
                Ok(Value(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Value, E> {
                Ok(Value(if v.is_infinite() {
                    if v > 0.0 { "inf" } else { "-inf" }.to_string()
                } else {
                    v.to_string()
                }))
            }
            fn visit_f32<E: de::Error>(self, v: f32) -> std::result::Result<Value, E> {
                self.visit_f64(v as f64)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Value, E> {
                Ok(Value(v.to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Value, E> {
                Ok(Value(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether a RON file is an experiment (it names a `scenario`) rather than
/// a scenario. A file that does not parse is taken for a scenario, whose
/// loader then says what is wrong with it.
pub fn is_experiment(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    match ron_options().from_str::<ron::Value>(&text) {
        Ok(ron::Value::Map(m)) => m.iter().any(|(k, v)| {
            *k == ron::Value::String("scenario".into()) && matches!(v, ron::Value::String(_))
        }),
        _ => false,
    }
}

/// Reads an experiment file; errors name the file, line, column and field.
pub fn load_experiment(path: &Path) -> Result<Experiment> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::new(format!("cannot read experiment {}: {e}", path.display())))?;
    parse_ron(&text, path)
}
