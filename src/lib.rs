//! p2ptrain: data-parallel neural-network training across MPI ranks and local replicas, in the
//! line of Caffe's P2PManager/P2PSync. The binary (`main.rs`) only parses arguments and calls
//! `cmd`; the work happens here.
//!
//! Dependency direction, from the modules that import nothing of the crate up to the top:
//! `error`, `tensor`, `backend`, `spans`, `input_file` → `config` (the schema, parsing, typed
//! layer parameters and the layer registry) → `params`, `precision` → `layers` → `net` → `solver` → `signals`
//! → `snapshot` → `resume` → `data` → `validate` (loading a config: parsing plus the whole-config
//! checks, which read data file headers and infer shapes through the layers) → `predict` →
//! `caffe` (import and export) → `inputs` → `dist` → `metrics`, `logging`, `output_folder` →
//! `cuda` (the GPU backend: device, kernels, GPU layers, NCCL) → `parallel` (`P2PManager`,
//! `P2PSync`, the CPU and GPU engines, gradient buckets, the timeline) → `chrome_trace` → `cmd`
//! (the subcommands). Every input file is opened
//! through `input_file`. No module imports one above it outside of tests.

// The crate is an application: its docs are read with `--document-private-items`, where links
// to private items resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub mod backend;
pub mod caffe;
pub mod chrome_trace;
pub mod cmd;
pub mod config;
/// The layer tables of the test configs, shared with the integration tests.
#[cfg(test)]
#[path = "../tests/common/config_text.rs"]
mod config_text;
pub mod cuda;
pub mod data;
pub mod dist;
pub mod error;
pub mod input_file;
/// The input files the tests write, shared with the integration tests.
#[cfg(test)]
#[path = "../tests/common/input_files.rs"]
mod input_files;
pub mod inputs;
pub mod layers;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod output_folder;
pub mod parallel;
pub mod params;
pub mod precision;
pub mod predict;
pub mod resume;
pub mod signals;
pub mod snapshot;
pub mod solver;
pub mod spans;
pub mod tensor;
pub mod validate;
