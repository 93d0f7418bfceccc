//! Reading the user's RON files (scenarios, experiment files, GPU presets):
//! errors name the file, line, column and the field's dotted path.

use serde::de::DeserializeOwned;
use std::path::Path;

use crate::error::{Error, Result};

/// How pdsim reads RON: `Some(x)` may be written `x`.
pub fn ron_options() -> ron::Options {
    ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME)
}

/// Parses RON text; errors name file, line, column and the field's dotted path.
pub fn parse_ron<T: DeserializeOwned>(text: &str, file: &Path) -> Result<T> {
    let mut de = ron::Deserializer::from_str_with_options(text, &ron_options())
        .map_err(|e| Error::new(format!("{}:{e}", file.display())))?;
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let spanned = de.span_error(e.into_inner());
        let pos = spanned.span.start;
        Error::new(format!(
            "{}:{}:{}: in field `{}`: {}",
            file.display(),
            pos.line,
            pos.col,
            path,
            spanned.code
        ))
    })?;
    de.end()
        .map_err(|e| Error::new(format!("{}: {}", file.display(), de.span_error(e))))?;
    Ok(value)
}
