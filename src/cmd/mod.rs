//! The subcommands beside training that have a module of their own: `bench-allreduce` (NCCL or
//! the CPU path, checked then timed over a sweep of sizes). `train`, `check` and `bench` run
//! through [`crate::app`].

pub mod bench_allreduce;
