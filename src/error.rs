//! Typed library errors. Every variant names what went wrong where (key, file, op, rank), and maps to
//! the process exit code: 2 for bad usage, config or input, 1 for runtime failures.

use std::fmt;
use std::path::Path;

/// A position in a config file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

/// All errors of the library. `main` wraps them with `anyhow` context at most.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config value is missing, unknown, mistyped or out of range.
    #[error("{}", fmt_config(file, pos, key, msg))]
    Config {
        /// The config file, or `--set` when the value came from the command line.
        file: String,
        pos: Option<Pos>,
        /// Dotted key, e.g. `solver.base_lr` or `layer[2].num_output`.
        key: String,
        msg: String,
    },
    /// A data file is missing, truncated or inconsistent.
    #[error("{path}: {msg}")]
    Data { path: String, msg: String },
    /// A weights or snapshot file is missing, corrupt or does not fit the net.
    #[error("{path}: {msg}")]
    Snapshot { path: String, msg: String },
    /// The net cannot be built from the layers given (shapes, blob names).
    #[error("layer `{layer}`: {msg}")]
    Net { layer: String, msg: String },
    /// Bad command-line usage.
    #[error("{0}")]
    Usage(String),
    /// An operating-system I/O failure at run time (disk full, permissions).
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A collective operation failed or the ranks disagree.
    #[error("{0}")]
    Comm(String),
    /// A GPU, its driver or one of its libraries (CUDA, cuBLAS, cuDNN, NVRTC) failed or is missing.
    #[error("{0}")]
    Device(String),
    /// Training computed a NaN or an infinity (a diverging run).
    #[error("{0}")]
    NotFinite(String),
}

fn fmt_config(file: &str, pos: &Option<Pos>, key: &str, msg: &str) -> String {
    match pos {
        Some(p) => format!("{file}:{}:{}: `{key}`: {msg}", p.line, p.col),
        None => format!("{file}: `{key}`: {msg}"),
    }
}

impl Error {
    /// Exit code of the process for this error: 2 for usage, config and input errors, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config { .. }
            | Error::Data { .. }
            | Error::Snapshot { .. }
            | Error::Net { .. }
            | Error::Usage(_) => 2,
            Error::Io { .. } | Error::Comm(_) | Error::Device(_) | Error::NotFinite(_) => 1,
        }
    }

    /// A data error about `path`.
    pub fn data(path: impl AsRef<Path>, msg: impl fmt::Display) -> Self {
        Error::Data {
            path: path.as_ref().display().to_string(),
            msg: msg.to_string(),
        }
    }

    /// A snapshot or weights error about `path`.
    pub fn snapshot(path: impl AsRef<Path>, msg: impl fmt::Display) -> Self {
        Error::Snapshot {
            path: path.as_ref().display().to_string(),
            msg: msg.to_string(),
        }
    }

    /// A net-construction error about layer `layer`.
    pub fn net(layer: impl Into<String>, msg: impl fmt::Display) -> Self {
        Error::Net {
            layer: layer.into(),
            msg: msg.to_string(),
        }
    }

    /// An I/O error with what was being done.
    pub fn io(context: impl fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            context: context.to_string(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
