//! The subcommands, one module each, above every other module of the crate (the binary,
//! `main.rs`, only parses arguments and calls them): [`train`] (`train`, `check`, `bench`, and
//! the shared flow of [`test`](mod@test) (the test phase alone) and [`predict`] (class probabilities of
//! inputs): MPI start-up, config, data and weights agreed by every rank, the `P2PManager` run),
//! `bench-allreduce` (NCCL or the CPU path, checked then timed over a sweep of sizes), `plot`
//! (curves from `metrics.jsonl`), `compute-mean` (a dataset's mean image as a Caffe
//! `binaryproto`), `convert-imageset` (a list of images into a Caffe LMDB), `bench-data` (the
//! images per second of one rank's data pipeline), `import-caffe` and `export` (Caffe's files and
//! torchvision's names, through `crate::caffe`). The subcommands that run on every rank start
//! through `start_rank`.

pub mod bench_allreduce;
pub mod bench_data;
pub mod compute_mean;
pub mod convert_imageset;
pub mod export;
pub mod import_caffe;
pub mod plot;
pub mod predict;
pub mod test;
pub mod train;

use crate::dist::Bootstrap;

/// MPI start-up of a subcommand that runs on every rank, then the logging of this rank: the
/// bootstrap, or the exit code of its error (said on stderr).
fn start_rank() -> std::result::Result<Bootstrap, i32> {
    let boot = Bootstrap::init().map_err(|e| {
        eprintln!("p2ptrain: error: {e}");
        e.exit_code()
    })?;
    crate::logging::init(boot.rank, boot.size);
    Ok(boot)
}
