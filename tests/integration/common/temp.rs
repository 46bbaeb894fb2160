//! Scratch directories: one of its own per test, removed with everything in it when the
//! test lets go of it (at the end, or while a failed test unwinds).

use std::{
    io,
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

/// A directory of its own under the system temp dir, removed on drop: keep the value alive
/// for as long as the test (or anything it started) uses the path.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `goodput-<test crate>-<tag>-<pid>-<nanos>-<n>`: unique per process, call and
    /// time, so parallel tests, concurrent runs and leftovers of a killed run never meet.
    #[expect(
        clippy::panic,
        reason = "test support: a test that cannot make its directory cannot run"
    )]
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "goodput-{}-{tag}-{}-{nanos}-{n}",
            env!("CARGO_CRATE_NAME"),
            std::process::id()
        ));
        if let Err(e) = std::fs::create_dir_all(&path) {
            panic!("cannot create {}: {e}", path.display());
        }
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `contents` to the file `name` in this directory and returns its path.
    pub fn write(&self, name: &str, contents: &str) -> io::Result<PathBuf> {
        let path = self.0.join(name);
        std::fs::write(&path, contents)?;
        Ok(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
