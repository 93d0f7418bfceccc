//! The out dir of a sweep: where each run's report and distributions go,
//! and claiming a dir for one manifest.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::experiment::plan::{Manifest, Point};
pub use crate::metrics::figures::RunDistributions;
use crate::metrics::write_atomic;

pub(crate) fn run_path(out: &Path, point: &Point, seed: u64) -> PathBuf {
    out.join("runs")
        .join(&point.label)
        .join(format!("seed-{seed}.json"))
}

pub(crate) fn dist_path(out: &Path, point: &Point, seed: u64) -> PathBuf {
    out.join("runs")
        .join(&point.label)
        .join(format!("seed-{seed}.dist.json"))
}

pub(crate) fn read_manifest(dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join("manifest.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::new(format!("{}: not a sweep manifest: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::new(format!("cannot read {}: {e}", path.display()))),
    }
}

/// The first field in which two manifests differ.
pub(crate) fn first_difference(a: &Manifest, b: &Manifest) -> Option<String> {
    let (a, b) = (
        serde_json::to_value(a).expect("serializes"),
        serde_json::to_value(b).expect("serializes"),
    );
    let (a, b) = (
        a.as_object().expect("object"),
        b.as_object().expect("object"),
    );
    a.iter()
        .find(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
}

/// Claims `out` for `manifest`: writes the manifest, or checks the one there.
pub(crate) fn claim(out: &Path, manifest: &Manifest) -> Result<()> {
    if let Some(there) = read_manifest(out)? {
        if let Some(field) = first_difference(&there, manifest) {
            let what = if field == "fingerprint" {
                "the scenario or its scripts changed since".to_string()
            } else {
                format!("its `{field}` differs")
            };
            return Err(Error::new(format!(
                "{} holds a sweep made with different arguments ({what}): use another --out, or delete it to start afresh",
                out.display()
            )));
        }
        return Ok(());
    }
    write_atomic(&out.join("manifest.json"), &manifest.to_json())
}

pub(crate) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::new(format!("cannot read {}: {e}", path.display())))
}
