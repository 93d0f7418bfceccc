//! One error type: a message meant for the user, already naming the file,
//! script, line or field it is about.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub struct Error(String);

impl Error {
    pub fn new(message: impl Into<String>) -> Self {
        Error(message.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// The candidate nearest to a misspelled `name` (case-insensitive edit
/// distance, at most a third of the name's length, and at least 2 allowed),
/// to suggest in an error message.
pub fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = name.to_lowercase();
    let limit = (name.chars().count() / 3).max(2);
    candidates
        .into_iter()
        .map(|c| (edit_distance(&lower, &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != cb));
            diag = above;
        }
    }
    row[b.len()]
}

/// A number as a sentence shows it: plainly when it reads well, else in
/// scientific notation (`1e308`, not 309 digits).
pub fn num(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-4..1e9).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_are_near_and_only_near() {
        // "H20" → "H200": one insertion.
        assert_eq!(suggest("H20", ["A100-80GB", "H200", "B200"]), Some("H200"));
        assert_eq!(suggest("kitten", ["sitting"]), None); // 3 edits > 2
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(suggest("xyz", ["H200"]), None);
    }
}
