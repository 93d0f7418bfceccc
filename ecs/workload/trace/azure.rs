//! The Azure LLM inference trace CSV (2023 and 2024 releases): `TIMESTAMP`
//! (`2023-11-16 18:15:46.6805900`), `ContextTokens`, `GeneratedTokens`. It
//! says nothing about shared prompts: every request is its own stream.
//! Times count from the earliest timestamp.

use std::path::Path;

use crate::error::{Error, Result};
use crate::workload::trace::Record;

/// The records of an Azure trace CSV; errors name the file, line and column.
pub fn read(text: &str, path: &Path) -> Result<Vec<Record>> {
    let file = path.display();
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines
        .next()
        .ok_or_else(|| Error::new(format!("{file}: empty trace")))?;
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let column = |name: &str| {
        columns.iter().position(|c| *c == name).ok_or_else(|| {
            Error::new(format!(
                "{file}:1: no `{name}` column (an Azure trace has TIMESTAMP, ContextTokens, GeneratedTokens; \
                 found {})",
                columns.join(", ")
            ))
        })
    };
    let (ts, ctx, gen_) = (
        column("TIMESTAMP")?,
        column("ContextTokens")?,
        column("GeneratedTokens")?,
    );
    let mut out = Vec::new();
    for (i, line) in lines {
        let n = i + 1;
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let cell = |k: usize| {
            cells.get(k).copied().ok_or_else(|| {
                Error::new(format!(
                    "{file}:{n}: {} cells, no `{}`",
                    cells.len(),
                    columns[k]
                ))
            })
        };
        let tokens = |k: usize, min: u32| -> Result<u32> {
            let v = cell(k)?;
            v.parse::<u32>().ok().filter(|&t| t >= min).ok_or_else(|| {
                Error::new(format!(
                    "{file}:{n}: column `{}`: `{v}` is not a whole number >= {min}",
                    columns[k]
                ))
            })
        };
        let t = cell(ts)?;
        let seconds = parse_timestamp(t).ok_or_else(|| {
            Error::new(format!(
                "{file}:{n}: column `TIMESTAMP`: `{t}` is not a date and time like 2023-11-16 18:15:46.6805900"
            ))
        })?;
        out.push(Record {
            line: n,
            name: format!("line {n}"),
            timestamp: Some(seconds),
            input: tokens(ctx, 1)?,
            output: tokens(gen_, 1)?,
            ..Record::default()
        });
    }
    let t0 = out
        .iter()
        .filter_map(|r| r.timestamp)
        .fold(f64::INFINITY, f64::min);
    for r in &mut out {
        r.timestamp = r.timestamp.map(|t| t - t0);
    }
    Ok(out)
}

/// Seconds since 1970-01-01 of `YYYY-MM-DD HH:MM:SS[.fraction]` (UTC; a
/// `T` may separate date and time, a trailing `Z` or `+00:00` is allowed).
pub fn parse_timestamp(s: &str) -> Option<f64> {
    let s = s.trim().trim_matches('"');
    let s = s
        .strip_suffix('Z')
        .or_else(|| s.strip_suffix("+00:00"))
        .unwrap_or(s);
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-');
    let (y, m, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut t = time.split(':');
    let (hh, mm): (i64, i64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    let sec: f64 = t.next()?.parse().ok()?;
    if t.next().is_some()
        || !(0..24).contains(&hh)
        || !(0..60).contains(&mm)
        || !(0.0..61.0).contains(&sec)
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3_600 + mm * 60) as f64 + sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_seconds_since_the_epoch() {
        // 1970-01-02 00:00:01.5 is one day and 1.5 s after the epoch.
        assert_eq!(parse_timestamp("1970-01-02 00:00:01.5"), Some(86_401.5));
        // 2000-03-01 is day 11 017 (30 years, 7 leap days, Jan + Feb 2000).
        assert_eq!(
            parse_timestamp("2000-03-01T00:00:00Z"),
            Some(11_017.0 * 86_400.0)
        );
        let a = parse_timestamp("2023-11-16 18:15:46.6805900").unwrap();
        let b = parse_timestamp("2023-11-16 18:15:47.1805900").unwrap();
        assert!((b - a - 0.5).abs() < 1e-6);
        assert_eq!(parse_timestamp("2023-13-01 00:00:00"), None);
        assert_eq!(parse_timestamp("yesterday"), None);
    }
}
