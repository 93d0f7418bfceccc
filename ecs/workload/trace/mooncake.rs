//! Mooncake JSONL: one request per line — `timestamp` (ms), `input_length`,
//! `output_length`, `hash_ids` — as in the Mooncake release; the multi-turn
//! form adds `session_id` and, on a session's later turns, `delay` (ms of
//! think time after the previous turn finished) instead of `timestamp`.

use serde::Deserialize;
use std::io::BufRead;
use std::path::Path;

use crate::error::{Error, Result};
use crate::workload::trace::Record;

#[derive(Debug, PartialEq, Deserialize)]
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

/// A line in the plain form traces are written in (keys without escapes,
/// times as plain decimals, whole numbers, a session id that is a plain
/// string or a whole number), read by hand: what serde_json reads from it,
/// at a fraction of the cost (most of a trace's bytes are hash ids). None
/// for anything else, which serde_json then reads or refuses itself; so
/// whatever this reads, serde_json reads the same (checked in debug builds,
/// which the fuzzer runs).
fn fast_parse(raw: &[u8]) -> Option<Line> {
    let mut c = Cursor { b: raw, i: 0 };
    let (mut timestamp, mut delay, mut session_id) = (None, None, None);
    let (mut input_length, mut output_length, mut hash_ids) = (None, None, None);
    let mut session_seen = false;
    c.ws();
    c.eat(b'{')?;
    loop {
        c.ws();
        let key = c.string_bytes()?;
        c.ws();
        c.eat(b':')?;
        c.ws();
        // A repeated key is left to serde_json (which refuses it).
        match key {
            b"timestamp" if timestamp.is_none() => timestamp = Some(c.decimal()?),
            b"delay" if delay.is_none() => delay = Some(c.decimal()?),
            b"input_length" if input_length.is_none() => {
                input_length = Some(u32::try_from(c.whole()?).ok()?)
            }
            b"output_length" if output_length.is_none() => {
                output_length = Some(u32::try_from(c.whole()?).ok()?)
            }
            b"session_id" if !session_seen => {
                session_seen = true;
                session_id = c.session()?;
            }
            b"hash_ids" if hash_ids.is_none() => hash_ids = Some(c.ids()?),
            _ => return None,
        }
        c.ws();
        if c.eat(b',').is_none() {
            c.eat(b'}')?;
            break;
        }
    }
    c.ws();
    (c.i == c.b.len()).then_some(())?;
    Some(Line {
        timestamp,
        delay,
        session_id,
        input_length: input_length?,
        output_length: output_length?,
        hash_ids: hash_ids.unwrap_or_default(),
    })
}

/// Where [`fast_parse`] is in the line.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }
    fn digits(&mut self) -> &'a [u8] {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        &self.b[start..self.i]
    }
    /// A string without escapes or control characters.
    fn string(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.string_bytes()?).ok()
    }
    /// [`Self::string`]'s bytes, not checked as UTF-8 (a key is compared
    /// with the names of the fields, which are ASCII; anything else is
    /// refused, so the check would only cost).
    fn string_bytes(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match self.peek()? {
                b'"' => break,
                b'\\' => return None,
                c if c < 0x20 => return None,
                _ => self.i += 1,
            }
        }
        self.i += 1;
        Some(&self.b[start..self.i - 1])
    }
    /// A whole number of at most 19 digits (so it fits a u64; longer ones
    /// are left to serde_json), without a leading zero, and not the start
    /// of a fraction or an exponent. (One pass over the digits, in locals:
    /// most of a trace's bytes go through here.)
    fn whole(&mut self) -> Option<u64> {
        let (b, start) = (self.b, self.i);
        let mut i = start;
        let mut v: u64 = 0;
        while let Some(&c) = b.get(i) {
            let d = c.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            // (No overflow: 19 digits stay below 10^19 < 2^64.)
            v = v.wrapping_mul(10).wrapping_add(u64::from(d));
            i += 1;
        }
        let n = i - start;
        if n == 0 || n > 19 || (b[start] == b'0' && n > 1) {
            return None;
        }
        if matches!(b.get(i), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        self.i = i;
        Some(v)
    }
    /// `digits` or `digits.digits`, without a sign or an exponent, as the
    /// nearest f64 (as serde_json's `float_roundtrip` reads it).
    fn decimal(&mut self) -> Option<f64> {
        let start = self.i;
        let int = self.digits();
        if int.is_empty() || (int[0] == b'0' && int.len() > 1) {
            return None;
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits().is_empty() {
                return None;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            return None;
        }
        let text = std::str::from_utf8(&self.b[start..self.i]).ok()?;
        text.parse::<f64>().ok().filter(|v| v.is_finite())
    }
    /// `null` (no session), a plain string or a whole number.
    fn session(&mut self) -> Option<Option<serde_json::Value>> {
        match self.peek()? {
            b'"' => Some(Some(serde_json::Value::String(self.string()?.to_string()))),
            b'n' => {
                for &c in b"null" {
                    self.eat(c)?;
                }
                Some(None)
            }
            _ => Some(Some(serde_json::Value::from(self.whole()?))),
        }
    }
    /// A list of whole numbers. In the plain form (digits and commas) a
    /// number of up to seven digits and the comma or bracket after it are
    /// read from one 8-byte word, in locals; anything else goes through
    /// `short_whole`, `whole` and `ws` as before. A trace's ids mostly count
    /// up by one: the next id's digits are guessed from the last one's
    /// ([`Guess`]), and a word that holds them (and its comma) is the id
    /// without a parse.
    fn ids(&mut self) -> Option<Vec<u64>> {
        self.eat(b'[')?;
        self.ws();
        if self.eat(b']').is_some() {
            return Some(Vec::new());
        }
        // Room for an id per four bytes left (a trace's ids take about
        // eight, with their commas): one allocation instead of a doubling
        // series.
        let mut ids = Vec::with_capacity((self.b.len() - self.i) / 4 + 1);
        let (b, mut i) = (self.b, self.i);
        let mut g = Guess::NONE;
        loop {
            if g.left > 0 {
                // The ids guessed right, counted first, then added as one
                // range. The list's last id, before its bracket, is parsed
                // below.
                let (first, at) = (g.id, g.read(b, i));
                if at > i {
                    ids.extend(first..g.id);
                    i = at;
                    continue;
                }
                // (The next id is not the guess: it is parsed below.)
            }
            if let Some(w) = word_at(b, i) {
                let (k, v) = digits_in(w);
                // (`& 7`: eight digits leave no byte after them in the word;
                // k = 8 is refused below.)
                let after = (w >> (8 * (k & 7))) as u8;
                // One to seven digits, no leading zero, then , or ].
                if (1..8).contains(&k)
                    && !(w as u8 == b'0' && k > 1)
                    && (after == b',' || after == b']')
                {
                    ids.push(v);
                    i += k + 1;
                    if after == b']' {
                        self.i = i;
                        return Some(ids);
                    }
                    g = Guess::after(w, k, v + 1);
                    continue;
                }
            }
            g = Guess::NONE;
            self.i = i;
            self.ws();
            let id = match self.short_whole() {
                Some(v) => v,
                None => self.whole()?,
            };
            ids.push(id);
            self.ws();
            if self.eat(b',').is_none() {
                self.eat(b']')?;
                return Some(ids);
            }
            i = self.i;
        }
    }

    /// `whole` for a number of one to seven digits, all eight bytes from
    /// here looked at at once (SIMD within a register); None, consuming
    /// nothing, for anything else (fewer than eight bytes left, eight
    /// digits or more), which `whole` then reads or refuses.
    fn short_whole(&mut self) -> Option<u64> {
        let w = word_at(self.b, self.i)?;
        let (n, v) = digits_in(w);
        if !(1..8).contains(&n) {
            return None;
        }
        let (first, after) = (w as u8, (w >> (8 * n)) as u8);
        if (first == b'0' && n > 1) || matches!(after, b'.' | b'e' | b'E') {
            return None;
        }
        self.i += n;
        Some(v)
    }
}

/// The next id of a list that counts up by one, as the bytes it would be
/// written in: its digits and the comma after them (first byte lowest), so
/// one mask and one compare of the next eight bytes read it.
#[derive(Clone, Copy)]
struct Guess {
    /// The id, and how many ids from it on the guess holds for: up to the
    /// next carry out of the last digit (after 120 come 121 to 129), where
    /// the next guess is worked out from the last id's digits.
    id: u64,
    left: u32,
    /// Its digits and comma, the bytes they take, and the last digit's step.
    want: u64,
    mask: u64,
    len: usize,
    step: u64,
}

impl Guess {
    const NONE: Guess = Guess {
        id: 0,
        left: 0,
        want: 0,
        mask: 0,
        len: 0,
        step: 0,
    };

    /// The guess for `id`, the id after one written as the first `n` (1 to
    /// 7) bytes of `w`; none when `id` takes a digit more (after 999).
    fn after(w: u64, n: usize, id: u64) -> Guess {
        let Some(digits) = increment(w & (u64::MAX >> (8 * (8 - n))), n) else {
            return Guess::NONE;
        };
        let last = 8 * (n - 1);
        Guess {
            id,
            left: u32::from(b'9' - (digits >> last) as u8) + 1,
            want: digits | u64::from(b',') << (8 * n),
            mask: u64::MAX >> (8 * (7 - n)),
            len: n + 1,
            step: 1u64 << last,
        }
    }

    /// Reads the ids from `at` on in `b` that are guessed right (each with
    /// its comma), across carries; returns where they end, the guess left
    /// at the id after them. (Not inlined: in a function of its own the
    /// scan keeps its state in registers.)
    #[inline(never)]
    fn read(&mut self, b: &[u8], mut at: usize) -> usize {
        let (n, digits_mask) = (self.len - 1, self.mask >> 8);
        let comma = self.want & !digits_mask;
        let (mut id, mut left, mut want) = (self.id, self.left, self.want);
        loop {
            let mut count = 0u32;
            while count < left && word_at(b, at).is_some_and(|w| w & self.mask == want) {
                (count, at, want) = (count + 1, at + self.len, want + self.step);
            }
            id += u64::from(count);
            if count < left {
                (self.id, self.left, self.want) = (id, left - count, want);
                return at;
            }
            // Up to a carry out of the last digit: the next id's digits are
            // those of the last one read (`want`'s one step back) plus one,
            // and its last digit is a 0.
            match increment((want - self.step) & digits_mask, n) {
                Some(digits) => (want, left) = (digits | comma, 10),
                None => {
                    // (After 999: the id after is parsed.)
                    *self = Guess { id, ..Guess::NONE };
                    return at;
                }
            }
        }
    }
}

/// The number after the one written in the `n` (1 to 7) ASCII digits of
/// `digits` (first digit lowest), written in `n` digits; None when it
/// needs one more (all nines). SIMD within a register: the digits are
/// reversed so that the last is lowest, and each has 0xF6 added, so a 9
/// that receives the carry (and only it) carries on out of its byte.
fn increment(digits: u64, n: usize) -> Option<u64> {
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    let shift = 8 * (8 - n);
    // The digits' values, last digit in the lowest byte.
    let r = ((digits ^ ZEROS) << shift).swap_bytes();
    let t = r + (0xF6F6_F6F6_F6F6_F6F6 >> shift) + 1;
    if t >> (8 * n) != 0 {
        return None;
    }
    // A byte that carried out is 0 (the digit 0); the others are their
    // digit plus 0xF6 (high bit set).
    let v = t - ((t & 0x8080_8080_8080_8080) >> 7) * 0xF6;
    Some(((v.swap_bytes() >> shift) ^ ZEROS) & (u64::MAX >> shift))
}

/// The eight bytes of `b` from `i` on as one word, the first byte lowest
/// (None when fewer are left).
fn word_at(b: &[u8], i: usize) -> Option<u64> {
    b.get(i..)?
        .first_chunk::<8>()
        .map(|w| u64::from_le_bytes(*w))
}

/// The leading digits of the eight bytes of `w` (first byte lowest): how
/// many (8 when all are), and, when fewer than eight, their value (SIMD
/// within a register).
fn digits_in(w: u64) -> (usize, u64) {
    // Digits become their values 0..=9.
    let t = w ^ 0x3030_3030_3030_3030;
    // The top bit of each byte that is not a digit (a value of 10 or
    // more); a carry out of such a byte only reaches the bytes after it.
    let not_digit = (t.wrapping_add(0x7676_7676_7676_7676) | t) & 0x8080_8080_8080_8080;
    let n = (not_digit.trailing_zeros() / 8) as usize;
    if n == 0 || n == 8 {
        return (n, 0);
    }
    // The digits moved to the top bytes (first digit lowest), zeros below
    // them leading; then pairs, quads and the eight combined.
    let mut v = t << (8 * (8 - n));
    v = ((v & 0x0F0F_0F0F_0F0F_0F0F).wrapping_mul(10 << 8 | 1)) >> 8;
    v = ((v & 0x00FF_00FF_00FF_00FF).wrapping_mul(100 << 16 | 1)) >> 16;
    v = ((v & 0x0000_FFFF_0000_FFFF).wrapping_mul(10_000 << 32 | 1)) >> 32;
    (n, v)
}

/// `BufRead::read_until(b'\n', raw)`, with the end of the line found by
/// the memchr crate (vector instructions) rather than std's word-at-a-time
/// search: a trace of the peers' size is 185 MB, and the search was a tenth
/// of reading it.
fn read_line(reader: &mut impl BufRead, raw: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut len = 0;
    loop {
        let (done, used) = {
            let buf = match reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            match memchr::memchr(b'\n', buf) {
                Some(i) => {
                    raw.extend_from_slice(&buf[..=i]);
                    (true, i + 1)
                }
                None => {
                    raw.extend_from_slice(buf);
                    (buf.is_empty(), buf.len())
                }
            }
        };
        reader.consume(used);
        len += used;
        if done {
            return Ok(len);
        }
    }
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
    let mut raw: Vec<u8> = Vec::new();
    let mut n = 0;
    loop {
        raw.clear();
        n += 1;
        let len = read_line(&mut reader, &mut raw)
            .map_err(|e| Error::new(format!("{file}:{n}: cannot read: {e}")))?;
        if len == 0 {
            return Ok(());
        }
        // The hand parse reads the bytes (what it accepts is UTF-8: ASCII
        // outside the strings it checks); a line it leaves is checked as
        // UTF-8, as `read_line` would, then parsed by serde_json with the
        // path of each value tracked, for the error.
        let fast = fast_parse(&raw);
        debug_assert!(
            fast.is_none()
                || std::str::from_utf8(&raw).is_ok_and(|text| fast == tracked_parse(text).ok()),
            "the fast parse reads what serde_json reads: {}",
            String::from_utf8_lossy(&raw)
        );
        let line = match fast {
            Some(line) => line,
            None => {
                let text = std::str::from_utf8(&raw).map_err(|_| {
                    Error::new(format!(
                        "{file}:{n}: cannot read: stream did not contain valid UTF-8"
                    ))
                })?;
                if text.trim().is_empty() {
                    continue;
                }
                tracked_parse(text).map_err(|e| {
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
                })?
            }
        };
        let bad = |field: &str, why: &str| {
            let at = value_column(&raw, field).map_or(String::new(), |c| format!("{c}:"));
            Error::new(format!("{file}:{n}:{at} field `{field}`: {why}"))
        };
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

/// The 1-based column (in bytes, as serde_json counts it) of the value of
/// key `key` in a JSON line, for messages; None when the line does not
/// write the key plainly (an escape in it).
pub(super) fn value_column(raw: &[u8], key: &str) -> Option<usize> {
    let quoted = format!("\"{key}\"");
    let skip_space = |from: usize| {
        from + raw[from..]
            .iter()
            .take_while(|b| b.is_ascii_whitespace())
            .count()
    };
    // A quoted key is the only place its quoted name can be followed by a
    // colon: inside a string value a quote ends the string.
    memchr::memmem::find_iter(raw, quoted.as_bytes()).find_map(|i| {
        let colon = skip_space(i + quoted.len());
        (raw.get(colon) == Some(&b':')).then(|| skip_space(colon + 1) + 1)
    })
}

/// The column of `key`'s value on line `line` (1-based) of the trace file
/// at `path` ([`value_column`]), read again for a message.
pub(super) fn value_column_in_file(path: &Path, line: usize, key: &str) -> Option<usize> {
    let file = std::fs::File::open(path).ok()?;
    let mut reader = std::io::BufReader::new(file);
    let mut raw = Vec::new();
    for _ in 0..line {
        raw.clear();
        if read_line(&mut reader, &mut raw).ok()? == 0 {
            return None;
        }
    }
    value_column(&raw, key)
}

/// The line parsed with the path of each value tracked (the same parser,
/// so the same outcome as the plain parse, with the failing field named).
fn tracked_parse(
    raw: &str,
) -> std::result::Result<Line, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// serde_json's reading of a line (None: it refuses it).
    fn serde(line: &str) -> Option<Line> {
        tracked_parse(line).ok()
    }

    #[test]
    fn the_hand_parse_reads_what_serde_json_reads() {
        for line in [
            r#"{"session_id":"s0","timestamp":240.485,"input_length":2735,"output_length":325,"hash_ids":[0,1,2]}"#,
            r#"{ "session_id" : 7 , "delay" : 30 , "input_length" : 40 , "output_length" : 3 , "hash_ids" : [ 9999999999999999999 ] }"#,
            "{\"input_length\":4,\"output_length\":1,\"session_id\":null,\"hash_ids\":[]}\r\n",
            r#"{"input_length":4,"output_length":1}"#,
            r#"{"timestamp":0.1,"input_length":4,"output_length":1,"hash_ids":[0]}"#,
        ] {
            let fast = fast_parse(line.as_bytes());
            assert!(fast.is_some(), "{line}");
            assert_eq!(fast, serde(line), "{line}");
        }
    }

    /// The ids as the hand parse reads them, which must be serde_json's.
    fn ids_of(list: &str) -> Option<Vec<u64>> {
        let line = format!(r#"{{"input_length":4,"output_length":1,"hash_ids":{list}}}"#);
        let fast = fast_parse(line.as_bytes());
        assert_eq!(fast, serde(&line), "{line}");
        fast.map(|l| l.hash_ids)
    }

    #[test]
    fn ids_that_count_up_are_read_as_written() {
        // Runs that count up across a carry (8 to 11, 98 to 101, 999 to
        // 1000), an id whose first digits are the guess (15 then 150), a
        // jump down, a run that ends the list, spaces that stop the fast
        // read, ids of eight digits and more.
        for (list, ids) in [
            ("[8,9,10,11]", vec![8, 9, 10, 11]),
            ("[98,99,100,101,102]", vec![98, 99, 100, 101, 102]),
            ("[998,999,1000,1001]", vec![998, 999, 1000, 1001]),
            ("[14,150,151,16]", vec![14, 150, 151, 16]),
            ("[7,3,4,5]", vec![7, 3, 4, 5]),
            // A guessed run that ends the list, and one up to its carry.
            ("[120,121,122]", vec![120, 121, 122]),
            ("[0,1,2,3,4,5,6,7,8,9,10]", (0..=10).collect()),
            ("[1, 2,3 ,4,5]", vec![1, 2, 3, 4, 5]),
            (
                "[9999999,10000000,10000001,5]",
                vec![9999999, 10000000, 10000001, 5],
            ),
        ] {
            assert_eq!(ids_of(list), Some(ids), "{list}");
        }
        // What serde_json refuses, the hand parse leaves to it.
        for bad in ["[1,2,]", "[1,02,3]", "[1,2.5,3]", "[1,2e3]", "[1,,2]"] {
            assert_eq!(ids_of(bad), None, "{bad}");
        }
        // Lists drawn at random: runs up by one from random starts (one to
        // seven digits), in plain form or with spaces.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut draw = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..2000 {
            let mut ids = Vec::new();
            for _ in 0..1 + draw(4) {
                let digits = 1 + draw(7) as u32;
                let start = draw(10u64.pow(digits));
                ids.extend(start..start + draw(30));
            }
            let sep = if draw(5) == 0 { ", " } else { "," };
            let text: Vec<String> = ids.iter().map(u64::to_string).collect();
            assert_eq!(ids_of(&format!("[{}]", text.join(sep))), Some(ids));
        }
    }

    #[test]
    fn increment_counts_up_in_ascii_digits() {
        // Every number of one to four digits, and seven-digit ones around
        // carries; the number after it, or None where it needs a digit more.
        let digits = |v: u64, n: usize| {
            let text = format!("{v:0n$}");
            let mut w = [0u8; 8];
            w[..n].copy_from_slice(text.as_bytes());
            u64::from_le_bytes(w)
        };
        let many = (1..=4).flat_map(|n| (0..10u64.pow(n as u32)).map(move |v| (v, n)));
        let carries = [
            999_999u64, 1_000_000, 1_234_569, 1_239_999, 9_999_998, 9_999_999,
        ]
        .map(|v| (v, 7));
        for (v, n) in many.chain(carries) {
            let next = (v + 1 < 10u64.pow(n as u32)).then(|| digits(v + 1, n));
            assert_eq!(increment(digits(v, n), n), next, "{v} in {n} digits");
        }
    }

    #[test]
    fn a_value_is_found_by_its_key_not_by_a_string_equal_to_it() {
        // `{"a":1,"input_length" : 0}`: the key's quotes at bytes 7 and
        // 20, the colon at 22, the value at byte 24: column 25.
        assert_eq!(
            value_column(br#"{"a":1,"input_length" : 0}"#, "input_length"),
            Some(25)
        );
        // The session's id is the string "input_length" (bytes 14 to 27,
        // a comma after it); the key is at 29 to 42, its value at byte
        // 44: column 45.
        let line = br#"{"session_id":"input_length","input_length":0}"#;
        assert_eq!(value_column(line, "input_length"), Some(45));
        // A key written with an escape is not found (the message then has
        // no column), nor is one the line lacks.
        assert_eq!(
            value_column(br#"{"input\u005flength":0}"#, "input_length"),
            None
        );
        assert_eq!(value_column(br#"{"delay":0}"#, "input_length"), None);
    }

    #[test]
    fn a_value_out_of_range_is_refused_with_its_line_column_and_field() {
        // Line 2's `input_length` is 0: `{"timestamp":1,"input_length":0`
        // puts the 0 at byte 30, column 31.
        let text = b"{\"timestamp\":0,\"input_length\":4,\"output_length\":1}\n\
            {\"timestamp\":1,\"input_length\":0,\"output_length\":1}\n";
        let err = read(&text[..], Path::new("t.jsonl"), |_| Ok(true)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.jsonl:2:31: field `input_length`: a prompt has at least 1 token"
        );
    }

    #[test]
    fn a_line_that_is_not_utf8_is_refused_with_its_number() {
        // A session id with a byte that is not UTF-8, on line 2 (line 1
        // plain, line 3 never read).
        let text: &[u8] = b"{\"input_length\":4,\"output_length\":1}\n\
            {\"session_id\":\"a\xffb\",\"input_length\":4,\"output_length\":1}\n\
            {\"input_length\":4,\"output_length\":1}\n";
        let mut taken = 0;
        let err = read(text, Path::new("t.jsonl"), |_| {
            taken += 1;
            Ok(true)
        })
        .unwrap_err();
        assert_eq!(taken, 1);
        assert_eq!(
            err.to_string(),
            "t.jsonl:2: cannot read: stream did not contain valid UTF-8"
        );
    }

    #[test]
    fn lines_are_read_as_read_until_reads_them() {
        // Buffers of 1, 2, 3 and 64 bytes split the lines everywhere: a
        // line across buffers, an empty line, a last line without its
        // newline, and nothing after the end.
        let text = b"ab\n\ncdefg\nh\nlast";
        for cap in [1, 2, 3, 64] {
            let mut ours = std::io::BufReader::with_capacity(cap, &text[..]);
            let mut std = std::io::BufReader::with_capacity(cap, &text[..]);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut lines = 0;
            loop {
                a.clear();
                b.clear();
                let n = read_line(&mut ours, &mut a).unwrap();
                assert_eq!(n, std.read_until(b'\n', &mut b).unwrap(), "capacity {cap}");
                assert_eq!(a, b, "capacity {cap}");
                if n == 0 {
                    break;
                }
                lines += 1;
            }
            assert_eq!(lines, 5, "capacity {cap}");
        }
    }

    #[test]
    fn a_short_number_read_a_word_at_a_time_is_the_number() {
        // Every length from 1 to 19 digits, with each kind of byte after it
        // and as many bytes left as the word needs or fewer.
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(5);
        for _ in 0..20_000 {
            let digits = rng.random_range(1..=19u32);
            let lo = if digits == 1 {
                0
            } else {
                10u64.pow(digits - 1)
            };
            let v: u64 = rng.random_range(lo..10u64.pow(digits));
            let after = [",", "]", " ", ".5", "e3", "", ",12345678", "x"][rng.random_range(0..8)];
            let line = format!("{v}{after}");
            let mut fast = Cursor {
                b: line.as_bytes(),
                i: 0,
            };
            let mut slow = Cursor {
                b: line.as_bytes(),
                i: 0,
            };
            let want = slow.whole();
            let plain = digits <= 7 && line.len() >= 8 && !matches!(after, ".5" | "e3");
            match fast.short_whole() {
                Some(got) => {
                    assert_eq!(Some(got), want, "{line}");
                    assert_eq!(fast.i, slow.i, "{line}");
                }
                None => {
                    assert!(
                        !plain,
                        "{line}: a plain short number, read a byte at a time"
                    );
                    assert_eq!(fast.i, 0, "{line}");
                }
            }
        }
        // Leading zeros are refused either way; a lone zero is a number.
        for line in ["0,1234567", "0123,4567", "00,123456"] {
            let mut c = Cursor {
                b: line.as_bytes(),
                i: 0,
            };
            let mut w = Cursor {
                b: line.as_bytes(),
                i: 0,
            };
            assert_eq!(c.short_whole().or_else(|| c.whole()), w.whole(), "{line}");
        }
    }

    #[test]
    fn the_hand_parse_leaves_the_rest_to_serde_json() {
        // Each is read by serde_json or refused by it, never by the hand
        // parse: escapes, signs, exponents, leading zeros, floats for whole
        // numbers, 20 digits (u64::MAX, then an overflow), nulls and repeats, unknown keys, a missing
        // field, trailing commas, text after the object.
        for line in [
            r#"{"hash\u005fids":[1],"input_length":4,"output_length":1}"#,
            r#"{"session_id":"a\"b","input_length":4,"output_length":1}"#,
            r#"{"timestamp":-0,"input_length":4,"output_length":1}"#,
            r#"{"timestamp":1e3,"input_length":4,"output_length":1}"#,
            r#"{"timestamp":01,"input_length":4,"output_length":1}"#,
            r#"{"timestamp":null,"input_length":4,"output_length":1}"#,
            r#"{"input_length":4.0,"output_length":1}"#,
            r#"{"input_length":4294967296,"output_length":1}"#,
            r#"{"input_length":4,"output_length":1,"hash_ids":[18446744073709551615]}"#,
            r#"{"input_length":4,"output_length":1,"hash_ids":[18446744073709551616]}"#,
            r#"{"input_length":4,"output_length":1,"hash_ids":[1.5]}"#,
            r#"{"input_length":4,"output_length":1,"hash_ids":null}"#,
            r#"{"input_length":4,"input_length":4,"output_length":1}"#,
            r#"{"input_length":4,"output_length":1,"tokens":2}"#,
            r#"{"output_length":1}"#,
            r#"{"input_length":4,"output_length":1,"hash_ids":[1,]}"#,
            r#"{"input_length":4,"output_length":1,}"#,
            r#"{"input_length":4,"output_length":1} x"#,
            r#"{"session_id":1.5,"input_length":4,"output_length":1}"#,
        ] {
            assert_eq!(fast_parse(line.as_bytes()), None, "{line}");
        }
        // What serde_json does with some of them: reads the escaped key and
        // the exponent, refuses the float length and the repeat.
        assert!(serde(r#"{"hash\u005fids":[1],"input_length":4,"output_length":1}"#).is_some());
        assert!(serde(r#"{"timestamp":1e3,"input_length":4,"output_length":1}"#).is_some());
        assert!(serde(r#"{"input_length":4.0,"output_length":1}"#).is_none());
        assert!(serde(r#"{"input_length":4,"input_length":4,"output_length":1}"#).is_none());
    }
}
