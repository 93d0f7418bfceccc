//! Model and GPU presets: the files of `lib/models/` (config.json subsets)
//! and `lib/gpus/` (RON), built into the binary; a scenario names one, or
//! gives a path to its own file.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result, suggest};
use crate::files::parse_ron;
use crate::hardware::{GpuSpec, ModelSpec};

const MODELS: [(&str, &str); 5] = [
    ("Qwen3-8B", include_str!("../../lib/models/Qwen3-8B.json")),
    (
        "Llama-3.1-8B",
        include_str!("../../lib/models/Llama-3.1-8B.json"),
    ),
    (
        "Llama-3.1-70B",
        include_str!("../../lib/models/Llama-3.1-70B.json"),
    ),
    (
        "gpt-oss-120b",
        include_str!("../../lib/models/gpt-oss-120b.json"),
    ),
    (
        "DeepSeek-V3",
        include_str!("../../lib/models/DeepSeek-V3.json"),
    ),
];

const GPUS: [(&str, &str); 6] = [
    ("A100-80GB", include_str!("../../lib/gpus/A100-80GB.ron")),
    ("H100-SXM", include_str!("../../lib/gpus/H100-SXM.ron")),
    ("H200", include_str!("../../lib/gpus/H200.ron")),
    ("B200", include_str!("../../lib/gpus/B200.ron")),
    ("L40S", include_str!("../../lib/gpus/L40S.ron")),
    ("MI300X", include_str!("../../lib/gpus/MI300X.ron")),
];

/// Whether a scenario's `model` or `gpu` value names a file rather than a preset.
pub fn is_path(value: &str) -> bool {
    value.contains('/') || value.ends_with(".json") || value.ends_with(".ron")
}

/// The names of the built-in model presets.
pub fn model_names() -> impl Iterator<Item = &'static str> {
    MODELS.iter().map(|m| m.0)
}

/// The names of the built-in GPU presets.
pub fn gpu_names() -> impl Iterator<Item = &'static str> {
    GPUS.iter().map(|g| g.0)
}

/// A preset's text: `<lib>/<folder>/<name>.<ext>` when the scenario's
/// `lib/` has one (a user's own preset), else the built-in one.
fn preset(
    what: &str,
    name: &str,
    builtin: &[(&'static str, &'static str)],
    lib: Option<&Path>,
    folder: &str,
    ext: &str,
) -> Result<(String, PathBuf)> {
    if let Some(lib) = lib {
        let p = lib.join(folder).join(format!("{name}.{ext}"));
        if let Ok(text) = std::fs::read_to_string(&p) {
            return Ok((text, p));
        }
    }
    if let Some((n, text)) = builtin.iter().find(|(n, _)| *n == name) {
        return Ok((
            text.to_string(),
            PathBuf::from(format!("lib/{folder}/{n}.{ext}")),
        ));
    }
    let names: Vec<&str> = builtin.iter().map(|b| b.0).collect();
    let hint = suggest(name, names.iter().copied())
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default();
    Err(Error::new(format!(
        "unknown {what} preset `{name}`{hint}; the presets are {}, or give the path of a file",
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::new(format!("cannot read {}: {e}", path.display())))
}

/// A model: a preset name, or the path of a Hugging Face `config.json`.
pub fn model(value: &str, lib: Option<&Path>) -> Result<ModelSpec> {
    let (text, file) = if is_path(value) {
        (read(Path::new(value))?, PathBuf::from(value))
    } else {
        preset("model", value, &MODELS, lib, "models", "json")?
    };
    ModelSpec::from_config_json(&text, &file, value)
}

/// A GPU: a preset name, or the path of a RON file like `lib/gpus/H200.ron`.
pub fn gpu(value: &str, lib: Option<&Path>) -> Result<GpuSpec> {
    let (text, file) = if is_path(value) {
        (read(Path::new(value))?, PathBuf::from(value))
    } else {
        preset("GPU", value, &GPUS, lib, "gpus", "ron")?
    };
    let spec: GpuSpec = parse_ron(&text, &file)?;
    match spec.problem() {
        Some(p) => Err(Error::new(format!("{}: {p}", file.display()))),
        None => Ok(spec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_reads() {
        for n in model_names() {
            model(n, None).unwrap();
        }
        for n in gpu_names() {
            let g = gpu(n, None).unwrap();
            assert_eq!(g.name, n, "the file's name field matches its preset name");
        }
    }

    #[test]
    fn an_unknown_preset_names_the_nearest_one() {
        let err = gpu("H20", None).unwrap_err().to_string();
        assert!(err.contains("unknown GPU preset `H20`"), "{err}");
        assert!(err.contains("did you mean `H200`"), "{err}");
        let err = model("llama-3.1-8b", None).unwrap_err().to_string();
        assert!(err.contains("did you mean `Llama-3.1-8B`"), "{err}");
    }
}
