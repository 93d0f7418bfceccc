//! Script parameters as a scenario gives them (`params: {...}`, `--set
//! router.decider.params.x=...`).

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;

/// A script parameter. Integers stay integers; `inf` (a RON float, or the
/// string "inf" on the command line) is an infinite float.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    List(Vec<ParamValue>),
    Map(BTreeMap<String, ParamValue>),
}

impl Serialize for ParamValue {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            ParamValue::Int(v) => s.serialize_i64(*v),
            // JSON (used for overrides) has no infinity: spell it.
            ParamValue::Float(v) if v.is_infinite() => {
                s.serialize_str(if *v > 0.0 { "inf" } else { "-inf" })
            }
            ParamValue::Float(v) => s.serialize_f64(*v),
            ParamValue::Bool(v) => s.serialize_bool(*v),
            ParamValue::Str(v) => s.serialize_str(v),
            ParamValue::List(v) => v.serialize(s),
            ParamValue::Map(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ParamValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ParamValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number, inf, a bool, a string, a list or a map")
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<ParamValue, E> {
                Ok(ParamValue::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<ParamValue, E> {
                i64::try_from(v)
                    .map(ParamValue::Int)
                    .map_err(|_| E::custom("integer too large"))
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<ParamValue, E> {
                Ok(ParamValue::Float(v))
            }
            fn visit_f32<E>(self, v: f32) -> std::result::Result<ParamValue, E> {
                // RON hands out f32 only when the value is exactly an f32.
                Ok(ParamValue::Float(v as f64))
            }
            fn visit_bool<E>(self, v: bool) -> std::result::Result<ParamValue, E> {
                Ok(ParamValue::Bool(v))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<ParamValue, E> {
                Ok(match v {
                    "inf" | "+inf" | "infinity" => ParamValue::Float(f64::INFINITY),
                    "-inf" | "-infinity" => ParamValue::Float(f64::NEG_INFINITY),
                    _ => ParamValue::Str(v.to_string()),
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<ParamValue, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = a.next_element()? {
                    out.push(v);
                }
                Ok(ParamValue::List(out))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<ParamValue, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((k, v)) = a.next_entry::<String, ParamValue>()? {
                    out.insert(k, v);
                }
                Ok(ParamValue::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}
