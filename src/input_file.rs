//! Opening and reading the files p2ptrain takes as input (config, weights, snapshot files, data
//! files, mean file, `metrics.jsonl` for `plot`): only regular files are read. A FIFO would block
//! the open or the read forever and a device such as `/dev/zero` never ends, so both are refused
//! before anything is read; a whole-file read is bounded by a limit the caller chooses, and by the
//! size the file had when it was opened (a file that grows meanwhile is read up to that size plus
//! one byte, to tell it grew).
//!
//! ```no_run
//! use p2ptrain::input_file::{read_regular, UNBOUNDED};
//! use std::path::Path;
//! let bytes = read_regular(Path::new("net.safetensors"), UNBOUNDED)?;
//! # Ok::<(), p2ptrain::input_file::InputError>(())
//! ```
//!
//! Callers turn an [`InputError`] into the [`crate::error::Error`] of their kind, naming the file.

use std::fmt;
use std::fs::{File, FileType, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// No limit but the file's own size.
pub const UNBOUNDED: u64 = u64::MAX;

/// Why an input file cannot be read.
#[derive(Debug)]
pub enum InputError {
    /// The path names nothing.
    Missing,
    /// The path names a directory, FIFO, device or socket (the kind given).
    NotRegular(&'static str),
    /// The file holds more bytes than the caller reads at most.
    TooLarge { limit: u64 },
    /// The operating system refused the open or a read.
    Io(std::io::Error),
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputError::Missing => write!(f, "no such file"),
            InputError::NotRegular(kind) => {
                write!(
                    f,
                    "not a regular file ({kind}): only regular files are read"
                )
            }
            InputError::TooLarge { limit } => {
                write!(f, "larger than the {limit} bytes read at most")
            }
            InputError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for InputError {}

impl From<std::io::Error> for InputError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::NotFound => InputError::Missing,
            _ => InputError::Io(e),
        }
    }
}

/// What kind of file `t` is, in words, for one that is not regular.
fn kind_of(t: &FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a plain file"
    }
}

/// Opens the regular file at `path` for reading and returns it with its size. The open does not
/// block on a FIFO (it is opened non-blocking, then refused, as is any other non-regular file).
pub fn open_regular(path: &Path) -> Result<(File, u64), InputError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(InputError::NotRegular(kind_of(&meta.file_type())));
    }
    Ok((file, meta.len()))
}

/// The whole regular file at `path`, at most `limit` bytes of it (a larger file is refused).
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, InputError> {
    let (file, len) = open_regular(path)?;
    if len > limit {
        return Err(InputError::TooLarge { limit });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // One byte past the size found at the open tells a file that grows without end.
    let most = len.saturating_add(1).min(limit.saturating_add(1));
    file.take(most).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge { limit });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.bin");
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(read_regular(&p, UNBOUNDED).unwrap(), b"hello");
        assert_eq!(read_regular(&p, 5).unwrap(), b"hello");
    }

    #[test]
    fn a_file_over_the_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.bin");
        std::fs::write(&p, b"hello").unwrap();
        let e = read_regular(&p, 4).unwrap_err();
        assert!(matches!(e, InputError::TooLarge { limit: 4 }), "{e}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_regular(&p, UNBOUNDED).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a regular file (a FIFO): only regular files are read"
        );
    }

    #[test]
    fn devices_directories_and_missing_paths_are_refused() {
        let e = read_regular(Path::new("/dev/zero"), UNBOUNDED).unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = read_regular(dir.path(), UNBOUNDED).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let e = read_regular(&dir.path().join("gone"), UNBOUNDED).unwrap_err();
        assert!(matches!(e, InputError::Missing), "{e}");
    }
}
