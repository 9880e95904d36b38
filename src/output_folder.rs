//! The output folder of a training run, as universal rank 0 claims it before the first
//! iteration: [`OutputLock`] keeps a second job from writing into the same folder, and
//! [`check_writable`] makes sure that every file the run will write (metrics, snapshots under
//! their longest name) can be created there, so that a bad location is an input error at start-up
//! rather than a failure after hours of training.
//!
//! ```no_run
//! # fn main() -> p2ptrain::error::Result<()> {
//! # let (cfg, source) = p2ptrain::validate::load(std::path::Path::new("cfg.toml"), &[])?;
//! use p2ptrain::output_folder::{check_writable, OutputLock};
//! let dir = std::path::Path::new("runs/cfg");
//! let _lock = OutputLock::acquire(dir, "node1")?; // held until dropped
//! check_writable(dir, &cfg.solver.snapshot_prefix, cfg.solver.max_iter, &source)?;
//! # Ok(())
//! # }
//! ```

use crate::config::Source;
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file in an output folder; it names the job that holds it.
pub const LOCK_FILE: &str = ".p2ptrain.lock";

/// An exclusive `flock` on the output folder's [`LOCK_FILE`], held for the job's lifetime. The
/// kernel releases it when the process ends, however it ends, so a lock left by a dead job never
/// blocks the next one.
#[derive(Debug)]
pub struct OutputLock {
    _file: File,
}

impl OutputLock {
    /// Creates `dir` if needed and locks it, writing `host`, this process's id and the time into
    /// the lock file. A folder another job holds is an [`Error::Usage`] naming that job.
    pub fn acquire(dir: &Path, host: &str) -> Result<Self> {
        create_output_dir(dir)?;
        let path = dir.join(LOCK_FILE);
        let cannot = |e: std::io::Error| {
            Error::Usage(format!(
                "--output {}: cannot lock the output folder ({}): {e}",
                dir.display(),
                path.display()
            ))
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(cannot)?;
        // SAFETY: flock only acts on the open descriptor `file` owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(cannot(e));
            }
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = match holder.trim() {
                "" => "a job that is still starting".to_string(),
                h => h.to_string(),
            };
            return Err(Error::Usage(format!(
                "--output {}: the output folder is in use by another job ({holder}; lock file {}); \
                 give this job another --output",
                dir.display(),
                path.display()
            )));
        }
        let holder = format!(
            "host {host}, pid {}, started {}\n",
            std::process::id(),
            utc_now()
        );
        file.set_len(0).map_err(cannot)?;
        (&file).write_all(holder.as_bytes()).map_err(cannot)?;
        Ok(OutputLock { _file: file })
    }
}

/// Creates the output folder (and its parents), naming `--output` when it cannot.
fn create_output_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| {
        Error::Usage(format!(
            "--output {}: cannot create the output folder: {e}",
            dir.display()
        ))
    })
}

/// Checks, before training, that the run can write into `dir`: `metrics.jsonl` beside a probe
/// file, and snapshots of `prefix` (relative to `dir`, may name sub-folders) up to iteration
/// `max_iter`, by creating and removing a file with the longest name a snapshot's temporary file
/// will have. An unwritable location is an error naming `--output` or `solver.snapshot_prefix`
/// (through `source`) and the path.
pub fn check_writable(dir: &Path, prefix: &str, max_iter: u64, source: &Source) -> Result<()> {
    create_output_dir(dir)?;
    let metrics_probe = dir.join(format!(".metrics.jsonl.probe-{}", std::process::id()));
    probe(&metrics_probe).map_err(|e| {
        Error::Usage(format!(
            "--output {}: cannot write files there ({}): {e}",
            dir.display(),
            metrics_probe.display()
        ))
    })?;
    let base = dir.join(prefix);
    let key = "solver.snapshot_prefix";
    let (Some(parent), Some(stem)) = (base.parent(), base.file_name().and_then(|s| s.to_str()))
    else {
        return Err(source.error(key, format!("{}: does not name a file", base.display())));
    };
    std::fs::create_dir_all(parent).map_err(|e| {
        source.error(
            key,
            format!(
                "cannot create the snapshot folder {}: {e}",
                parent.display()
            ),
        )
    })?;
    let longest = longest_snapshot_name(parent, stem, max_iter);
    probe(&longest).map_err(|e| {
        source.error(
            key,
            format!(
                "cannot write snapshots as {}: {e}",
                parent
                    .join(format!("{stem}_iter_{max_iter}.safetensors"))
                    .display()
            ),
        )
    })
}

/// The longest file name a snapshot of `stem` up to `max_iter` uses: the temporary file the
/// weights are staged in (`.<stem>_iter_<N>.safetensors.tmp-<pid>-<count>`).
fn longest_snapshot_name(parent: &Path, stem: &str, max_iter: u64) -> PathBuf {
    parent.join(format!(
        ".{stem}_iter_{max_iter}.safetensors.tmp-{}-{}",
        std::process::id(),
        u32::MAX
    ))
}

/// Creates `path` (which must not exist) and removes it.
fn probe(path: &Path) -> std::io::Result<()> {
    OpenOptions::new().write(true).create_new(true).open(path)?;
    std::fs::remove_file(path)
}

/// The current time, UTC, as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let t = secs as libc::time_t;
    // SAFETY: an all-zero `tm` is a valid value; gmtime_r only writes into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals.
    if unsafe { libc::gmtime_r(&t, &mut tm) }.is_null() {
        return format!("{secs} s after 1970-01-01 UTC");
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_folder_is_refused_naming_the_holder_and_freed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let held = OutputLock::acquire(dir.path(), "node-a").unwrap();
        let err = OutputLock::acquire(dir.path(), "node-b").unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.exit_code(), 2);
        assert!(msg.contains("in use by another job"), "{msg}");
        assert!(msg.contains("host node-a"), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(held);
        OutputLock::acquire(dir.path(), "node-b").unwrap();
    }

    #[test]
    fn a_snapshot_name_too_long_for_the_file_system_is_found_before_training() {
        let dir = tempfile::tempdir().unwrap();
        let (_, source) =
            crate::validate::load_str("t.toml", crate::cmd::train::QUICKSTART, Path::new("."), &[])
                .unwrap();
        check_writable(dir.path(), "snap/model", 1000, &source).unwrap();
        let long = "m".repeat(300);
        let err = check_writable(dir.path(), &long, 1000, &source).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("solver.snapshot_prefix"), "{err}");
        // Probes leave nothing behind.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("snap"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
