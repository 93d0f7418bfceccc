//! A file written as a run goes (one line per request, one event per step),
//! so that memory does not grow with the run, and atomically: it is written
//! beside its destination and renamed there when complete, so a reader
//! never sees half a file and an interrupted run leaves none.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub struct StreamFile {
    dest: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    /// The first write error (reported by `finish`).
    failed: Option<std::io::Error>,
}

impl StreamFile {
    pub fn create(dest: &Path) -> Result<StreamFile> {
        let dir = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::new(format!("cannot create {}: {e}", dir.display())))?;
        let name = dest
            .file_name()
            .ok_or_else(|| Error::new(format!("{} is not a file path", dest.display())))?;
        let tmp = dir.join(format!(
            ".{}.tmp{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let file = File::create(&tmp)
            .map_err(|e| Error::new(format!("cannot write {}: {e}", tmp.display())))?;
        Ok(StreamFile {
            dest: dest.to_path_buf(),
            tmp,
            out: Some(BufWriter::new(file)),
            failed: None,
        })
    }

    pub fn write(&mut self, text: &str) {
        if let Some(out) = &mut self.out
            && let Err(e) = out.write_all(text.as_bytes())
        {
            self.failed.get_or_insert(e);
        }
    }

    /// Flushes and moves the file to its destination.
    pub fn finish(mut self) -> Result<()> {
        let out = self.out.take().expect("finished once");
        let flushed = out.into_inner().map_err(|e| e.into_error());
        if let Some(e) = self.failed.take().or(flushed.err()) {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(Error::new(format!(
                "cannot write {}: {e}",
                self.tmp.display()
            )));
        }
        std::fs::rename(&self.tmp, &self.dest)
            .map_err(|e| Error::new(format!("cannot write {}: {e}", self.dest.display())))
    }
}

impl Drop for StreamFile {
    fn drop(&mut self) {
        // Not finished (the run failed): leave nothing behind.
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
