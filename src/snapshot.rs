//! Weight snapshots in the safetensors format: every learnable tensor under its
//! [`ParamSpan::full_name`](crate::params::ParamSpan::full_name) (`ip1.weight`, `ip1.bias`),
//! F32, little-endian, in its declared shape, plus free-form string metadata (`iter`,
//! `fingerprint`, …) in the header's `__metadata__`.
//!
//! Saving is atomic: the file is written to a temporary file in the target's directory, synced,
//! renamed over the target, and the directory is synced, so a crash or a full disk leaves either
//! the previous snapshot or the new one, never a torn file. Loading checks the whole file against
//! the net before it touches a weight and reports every problem at once.
//!
//! ```
//! use p2ptrain::config::FillerConfig;
//! use p2ptrain::params::{ParamSpan, Params};
//! use p2ptrain::snapshot::{load_weights, save_weights};
//! let span = |name: &str, shape: Vec<usize>| ParamSpan {
//!     layer: 0,
//!     full_name: name.into(),
//!     shape,
//!     offset: 0,
//!     len: 0,
//!     lr_mult: 1.0,
//!     decay_mult: 1.0,
//!     filler: FillerConfig::constant(0.0),
//! };
//! let mut params = Params::new(vec![span("ip1.weight", vec![2, 3]), span("ip1.bias", vec![2])]);
//! params.data.iter_mut().enumerate().for_each(|(i, w)| *w = i as f32);
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("model_iter_100.safetensors");
//! save_weights(&path, &params, &[("iter".into(), "100".into())]).unwrap();
//!
//! let mut loaded = Params::new(params.spans.clone());
//! load_weights(&path, &mut loaded).unwrap();
//! assert_eq!(loaded.data, params.data);
//! ```
//!
//! `tests/python/load_safetensors.py` lists a snapshot's tensors with the Python `safetensors`
//! package, to check files against other tools.

use crate::error::{Error, Result};
use crate::input_file::{read_regular, UNBOUNDED};
use crate::params::Params;
use safetensors::{Dtype, SafeTensorError, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::warn;

/// Writes every tensor of `params` to `path` as a safetensors file, with `metadata` as the
/// header's `__metadata__` (omitted when empty). Parent directories are created.
///
/// The write is atomic (see the module docs). On failure the temporary file is removed, whatever
/// was at `path` before is left as it was, and the error is [`Error::Io`] naming `path`
/// ([`Error::Snapshot`] if two tensors share a name).
pub fn save_weights(path: &Path, params: &Params, metadata: &[(String, String)]) -> Result<()> {
    let tensors: Vec<_> = params
        .spans
        .iter()
        .map(|s| {
            (
                s.full_name.as_str(),
                s.shape.as_slice(),
                &params.data[s.range()],
            )
        })
        .collect();
    save_tensors(path, &tensors, metadata)
}

/// Writes named F32 tensors `(name, shape, values)` to `path` as a safetensors file, with
/// `metadata` as the header's `__metadata__` (omitted when empty), atomically as
/// [`save_weights`] does. [`Error::Snapshot`] if two tensors share a name.
pub fn save_tensors(
    path: &Path,
    tensors: &[(&str, &[usize], &[f32])],
    metadata: &[(String, String)],
) -> Result<()> {
    let mut seen = HashSet::with_capacity(tensors.len());
    if let Some(dup) = tensors.iter().find(|t| !seen.insert(t.0)) {
        return Err(Error::snapshot(
            path,
            format!("two tensors are named `{}`", dup.0),
        ));
    }
    let views = tensors
        .iter()
        .map(|&(name, shape, data)| (name, F32View { shape, data }));
    let info = (!metadata.is_empty()).then(|| metadata.iter().cloned().collect::<HashMap<_, _>>());
    write_atomic(path, "snapshot", |tmp| {
        safetensors::serialize_to_file(views, info, tmp).map_err(|e| match e {
            SafeTensorError::IoError(source) => source,
            other => std::io::Error::other(other),
        })
    })
}

/// Reads the weights at `path` into `params.data`, matching tensors by `full_name`.
///
/// Every tensor of `params` must be in the file as F32 in its declared shape. Otherwise nothing is
/// written to `params` and the error is one [`Error::Snapshot`] naming the file and listing every
/// missing tensor, every shape mismatch (expected and found) and every wrong dtype. Tensors in the
/// file that the net does not have are ignored and listed in a warning. A file that cannot be read
/// or is not a complete safetensors file (truncated, corrupt header) is also [`Error::Snapshot`].
///
/// The file is read whole into memory rather than mapped, so a file truncated by another process
/// while loading is an error, not a crash.
pub fn load_weights(path: &Path, params: &mut Params) -> Result<()> {
    let bytes = read(path)?;
    let file = parse(path, &bytes)?;

    let mut problems = Vec::new();
    let mut found = Vec::with_capacity(params.spans.len());
    for s in &params.spans {
        match file.tensor(&s.full_name) {
            Ok(t) => {
                let mut ok = true;
                if t.dtype() != Dtype::F32 {
                    problems.push(format!(
                        "`{}`: dtype {} where F32 is expected",
                        s.full_name,
                        t.dtype()
                    ));
                    ok = false;
                }
                if t.shape() != s.shape.as_slice() {
                    problems.push(format!(
                        "`{}`: expected shape {:?}, found {:?}",
                        s.full_name,
                        s.shape,
                        t.shape()
                    ));
                    ok = false;
                }
                if ok {
                    found.push((s.range(), t));
                }
            }
            Err(_) => problems.push(format!(
                "`{}` (shape {:?}) is missing",
                s.full_name, s.shape
            )),
        }
    }
    if !problems.is_empty() {
        return Err(Error::snapshot(
            path,
            format!(
                "the weights do not fit the net ({} problem{}):\n  {}",
                problems.len(),
                if problems.len() == 1 { "" } else { "s" },
                problems.join("\n  ")
            ),
        ));
    }

    let mut extra: Vec<&str> = file
        .names()
        .into_iter()
        .filter(|n| params.find(n).is_none())
        .collect();
    if !extra.is_empty() {
        extra.sort_unstable();
        warn!(
            "{}: ignoring {} tensor(s) the net does not have: {}",
            path.display(),
            extra.len(),
            extra.join(", ")
        );
    }

    for (range, t) in found {
        let dst = &mut params.data[range];
        for (w, b) in dst.iter_mut().zip(t.data().chunks_exact(4)) {
            *w = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    check_finite(
        path,
        params
            .spans
            .iter()
            .map(|s| (&s.full_name, &params.data[s.range()])),
    )
}

/// Fails ([`Error::Snapshot`] naming `path`) on the first tensor of `tensors` (name, values) that
/// holds a NaN or an infinity, naming it: weights or solver history that would train on as NaN.
pub(crate) fn check_finite<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a String, &'a [f32])>,
) -> Result<()> {
    for (name, values) in tensors {
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::snapshot(
                path,
                format!(
                    "`{name}` holds {} at element {i}: not finite, refused (it would train on as \
                     NaN)",
                    values[i]
                ),
            ));
        }
    }
    Ok(())
}

/// The `__metadata__` of the safetensors file at `path`, sorted by key (empty if it has none).
pub fn load_metadata(path: &Path) -> Result<Vec<(String, String)>> {
    let bytes = read(path)?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| corrupt(path, &bytes, e))?;
    let mut out: Vec<_> = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    out.sort();
    Ok(out)
}

/// The whole file at `path` ([`Error::Snapshot`] naming it when it cannot be read).
pub(crate) fn read(path: &Path) -> Result<Vec<u8>> {
    read_regular(path, UNBOUNDED)
        .map_err(|e| Error::snapshot(path, format!("cannot read weights: {e}")))
}

/// `bytes` as a safetensors file ([`Error::Snapshot`] naming `path` when truncated or corrupt).
pub(crate) fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes).map_err(|e| corrupt(path, bytes, e))
}

fn corrupt(path: &Path, bytes: &[u8], e: SafeTensorError) -> Error {
    Error::snapshot(
        path,
        format!(
            "not a complete safetensors file ({} bytes; truncated or corrupt): {e}",
            bytes.len()
        ),
    )
}

/// One F32 tensor of `Params`, borrowed, for the safetensors writer.
struct F32View<'a> {
    shape: &'a [usize],
    data: &'a [f32],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            // SAFETY: any f32 bit pattern is valid as 4 bytes, u8 has alignment 1, and the byte
            // slice covers exactly the memory of `self.data` for the same lifetime.
            Cow::Borrowed(unsafe {
                std::slice::from_raw_parts(
                    self.data.as_ptr().cast::<u8>(),
                    std::mem::size_of_val(self.data),
                )
            })
        } else {
            Cow::Owned(self.data.iter().flat_map(|v| v.to_le_bytes()).collect())
        }
    }

    fn data_len(&self) -> usize {
        std::mem::size_of_val(self.data)
    }
}

/// Failure injection for testing: `P2PTRAIN_INJECT_SNAPSHOT_DELAY_MS=N` holds every file written
/// through [`write_atomic`] for N ms between writing its temporary and renaming it, so that a
/// test can signal a process while a temporary is on disk.
pub const INJECT_SNAPSHOT_DELAY: &str = "P2PTRAIN_INJECT_SNAPSHOT_DELAY_MS";

/// Sleeps for [`INJECT_SNAPSHOT_DELAY`] milliseconds when it is set.
fn injected_delay() {
    let ms = std::env::var(INJECT_SNAPSHOT_DELAY)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(ms) = ms {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Runs `write` on a fresh temporary file next to `path`, then syncs it, renames it over `path`
/// and syncs the directory. On any failure the temporary file is removed and `path` is untouched
/// (the rename is the only step that changes it, and it is atomic). `what` names the file in
/// errors ("snapshot"). While it is written, a second SIGINT removes the temporary before the
/// process exits (see `signals::PendingFile`).
pub(crate) fn write_atomic(
    path: &Path,
    what: &str,
    write: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<()> {
    let io = |e| Error::io(format!("writing {what} {}", path.display()), e);
    let file_name = path.file_name().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path names no file",
        ))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(|e| {
        Error::io(
            format!(
                "writing {what} {}: creating directory {}",
                path.display(),
                dir.display()
            ),
            e,
        )
    })?;

    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = dir.join(tmp_name);

    let staged = (|| {
        // Claim the name first, so an unrelated file is never overwritten or removed.
        OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        // A second SIGINT, which ends the process at once, removes the temporary first.
        let _pending = crate::signals::PendingFile::register(&tmp);
        let result = (|| {
            write(&tmp)?;
            injected_delay();
            OpenOptions::new().write(true).open(&tmp)?.sync_all()?;
            fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    })();
    staged.map_err(io)?;

    // The rename is durable once the directory entry is.
    File::open(&dir).and_then(|d| d.sync_all()).map_err(|e| {
        Error::io(
            format!(
                "writing {what} {}: syncing directory {}",
                path.display(),
                dir.display()
            ),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::ParamSpan;
    use safetensors::tensor::TensorView;

    fn span(name: &str, shape: &[usize]) -> ParamSpan {
        ParamSpan::unit(0, name, shape)
    }

    /// `ip1.weight (2, 3)`, `ip1.bias (2)`, `ip2.weight (1, 2)`, weights 0.5, 1.5, 2.5, …
    fn net() -> Params {
        let mut p = Params::new(vec![
            span("ip1.weight", &[2, 3]),
            span("ip1.bias", &[2]),
            span("ip2.weight", &[1, 2]),
        ]);
        for (i, w) in p.data.iter_mut().enumerate() {
            *w = i as f32 + 0.5;
        }
        p
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn snapshot_msg(r: Result<()>) -> String {
        match r {
            Err(e @ Error::Snapshot { .. }) => e.to_string(),
            other => panic!("expected Error::Snapshot, got {other:?}"),
        }
    }

    #[test]
    fn round_trip_keeps_names_shapes_values_and_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let p = net();
        let meta = vec![
            ("iter".to_string(), "100".to_string()),
            ("fingerprint".to_string(), "00ff".to_string()),
        ];
        save_weights(&path, &p, &meta).unwrap();

        let bytes = fs::read(&path).unwrap();
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let mut names = file.names();
        names.sort_unstable();
        assert_eq!(names, ["ip1.bias", "ip1.weight", "ip2.weight"]);
        let w = file.tensor("ip1.weight").unwrap();
        assert_eq!(w.dtype(), Dtype::F32);
        assert_eq!(w.shape(), [2, 3]);
        assert_eq!(&w.data()[..4], 0.5f32.to_le_bytes());

        let mut q = Params::new(p.spans.clone());
        load_weights(&path, &mut q).unwrap();
        assert_eq!(q.data, p.data);
        assert_eq!(
            load_metadata(&path).unwrap(),
            [
                ("fingerprint".to_string(), "00ff".to_string()),
                ("iter".to_string(), "100".to_string())
            ]
        );
        assert_eq!(entries(dir.path()), ["m.safetensors"]);
    }

    #[test]
    fn save_creates_parents_and_replaces_an_old_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/m.safetensors");
        let mut p = net();
        save_weights(&path, &p, &[]).unwrap();
        assert!(load_metadata(&path).unwrap().is_empty());
        p.data.iter_mut().for_each(|w| *w = -1.0);
        save_weights(&path, &p, &[]).unwrap();
        let mut q = Params::new(p.spans.clone());
        load_weights(&path, &mut q).unwrap();
        assert_eq!(q.data, p.data);
        assert_eq!(entries(&dir.path().join("a/b")), ["m.safetensors"]);
    }

    #[test]
    fn failed_write_leaves_the_previous_snapshot_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        save_weights(&path, &net(), &[]).unwrap();
        let before = fs::read(&path).unwrap();

        let err = write_atomic(&path, "snapshot", |tmp| {
            fs::write(tmp, b"half a file")?;
            Err(std::io::Error::other("no space left on device"))
        })
        .unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("m.safetensors"), "{err}");
        assert_eq!(fs::read(&path).unwrap(), before);
        assert_eq!(entries(dir.path()), ["m.safetensors"]);
    }

    #[test]
    fn failed_rename_removes_the_temporary() {
        // The target is a non-empty directory: writing the temporary succeeds, the rename fails.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("keep"), b"x").unwrap();

        let err = save_weights(&path, &net(), &[]).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(entries(dir.path()), ["m.safetensors"]);
        assert_eq!(entries(&path), ["keep"]);
    }

    #[test]
    fn path_inside_a_file_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("not_a_dir");
        fs::write(&blocker, b"x").unwrap();
        let path = blocker.join("m.safetensors");
        let err = save_weights(&path, &net(), &[]).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert_eq!(fs::read(&blocker).unwrap(), b"x");
    }

    #[test]
    fn read_only_directory_keeps_the_old_snapshot() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            eprintln!(
                "SKIPPED read_only_directory_keeps_the_old_snapshot: root ignores permissions"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        save_weights(&path, &net(), &[]).unwrap();
        let before = fs::read(&path).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o555)).unwrap();
        let result = save_weights(&path, &Params::new(net().spans), &[]);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(result, Err(Error::Io { .. })), "{result:?}");
        assert_eq!(fs::read(&path).unwrap(), before);
        assert_eq!(entries(dir.path()), ["m.safetensors"]);
    }

    #[test]
    fn duplicate_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = Params::new(vec![span("a.weight", &[1]), span("a.weight", &[2])]);
        let path = dir.path().join("m.safetensors");
        let msg = snapshot_msg(save_weights(&path, &p, &[]));
        assert!(msg.contains("`a.weight`"), "{msg}");
        assert!(!path.exists());
    }

    #[test]
    fn every_missing_and_misshaped_tensor_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        save_weights(&path, &net(), &[]).unwrap();

        let mut other = Params::new(vec![
            span("ip1.weight", &[3, 2]),
            span("ip1.bias", &[2]),
            span("ip2.weight", &[2]),
            span("ip3.weight", &[4, 2]),
            span("ip3.bias", &[4]),
        ]);
        other.data.fill(7.0);
        let msg = snapshot_msg(load_weights(&path, &mut other));
        assert!(msg.starts_with(&path.display().to_string()), "{msg}");
        assert!(msg.contains("4 problems"), "{msg}");
        assert!(
            msg.contains("`ip1.weight`: expected shape [3, 2], found [2, 3]"),
            "{msg}"
        );
        assert!(
            msg.contains("`ip2.weight`: expected shape [2], found [1, 2]"),
            "{msg}"
        );
        assert!(
            msg.contains("`ip3.weight` (shape [4, 2]) is missing"),
            "{msg}"
        );
        assert!(msg.contains("`ip3.bias` (shape [4]) is missing"), "{msg}");
        assert!(!msg.contains("ip1.bias"), "{msg}");
        // Nothing was loaded, not even the tensor that fits.
        assert!(other.data.iter().all(|&w| w == 7.0));
    }

    #[test]
    fn wrong_dtype_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let bytes: Vec<u8> = [1.0f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = TensorView::new(Dtype::F64, vec![2], &bytes).unwrap();
        fs::write(&path, safetensors::serialize([("b", t)], None).unwrap()).unwrap();

        let mut p = Params::new(vec![span("b", &[2])]);
        let msg = snapshot_msg(load_weights(&path, &mut p));
        assert!(
            msg.contains("`b`: dtype F64 where F32 is expected"),
            "{msg}"
        );
        assert_eq!(p.data, [0.0, 0.0]);
    }

    #[test]
    fn extra_tensors_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let p = net();
        save_weights(&path, &p, &[]).unwrap();
        let mut fewer = Params::new(vec![span("ip1.bias", &[2])]);
        load_weights(&path, &mut fewer).unwrap();
        assert_eq!(fewer.data, [6.5, 7.5]);
    }

    #[test]
    fn truncated_or_corrupt_files_are_snapshot_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        save_weights(&path, &net(), &[]).unwrap();
        let full = fs::read(&path).unwrap();
        let cut_path = dir.path().join("cut.safetensors");
        for cut in [0, 5, 8, 20, full.len() - 4, full.len() - 1] {
            fs::write(&cut_path, &full[..cut]).unwrap();
            let msg = snapshot_msg(load_weights(&cut_path, &mut net()));
            assert!(msg.contains("truncated or corrupt"), "cut {cut}: {msg}");
            assert!(msg.contains(&format!("({cut} bytes;")), "cut {cut}: {msg}");
        }
        fs::write(&cut_path, b"\x05\0\0\0\0\0\0\0hello").unwrap();
        let msg = snapshot_msg(load_weights(&cut_path, &mut net()));
        assert!(msg.contains("truncated or corrupt"), "{msg}");
    }

    #[test]
    fn missing_file_is_a_snapshot_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.safetensors");
        let msg = snapshot_msg(load_weights(&path, &mut net()));
        assert!(
            msg.contains("absent.safetensors: cannot read weights"),
            "{msg}"
        );
    }
}
