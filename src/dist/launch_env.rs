//! What the launcher says about a process's place in the job, read from the environment before
//! MPI is up: `mpirun` (OpenMPI's `OMPI_COMM_WORLD_*`), `srun` (`SLURM_PROCID`,
//! `SLURM_STEP_NUM_TASKS`, `SLURM_LOCALID`, only inside a job step) and torchrun (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`).
//!
//! It serves two purposes. The node-local rank picks the GPUs before any CUDA or MPI library
//! opens a device. And it catches the classic PMI mismatch: `srun` without a working `--mpi`
//! plugin starts N processes that each initialise MPI as a world of one and would each train
//! alone; [`LaunchEnv::check_world`] turns that into an error naming the launcher and the sizes.

use crate::error::{Error, Result};

/// The program that started this process, as far as the environment tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// OpenMPI's `mpirun` / `mpiexec` (also under Slurm: `mpirun` inside an allocation).
    OpenMpi,
    /// A Slurm job step (`srun`).
    Slurm,
    /// PyTorch's torchrun / `torch.distributed.run`.
    Torchrun,
}

impl Launcher {
    fn name(self) -> &'static str {
        match self {
            Launcher::OpenMpi => "mpirun",
            Launcher::Slurm => "srun",
            Launcher::Torchrun => "torchrun",
        }
    }
}

/// Rank, size and node-local rank as the launcher set them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchEnv {
    pub launcher: Launcher,
    pub rank: usize,
    pub size: usize,
    /// `None` when the launcher does not say.
    pub local_rank: Option<usize>,
}

impl LaunchEnv {
    /// Reads the process environment; `None` when no known launcher started the process (a plain
    /// `./p2ptrain`, which MPI treats as a singleton).
    pub fn detect() -> Option<LaunchEnv> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`detect`](Self::detect) over any variable lookup (tests). The first launcher whose rank
    /// and size are both present and parse wins, in the order mpirun, srun, torchrun: `mpirun`
    /// inside a Slurm allocation inherits the allocation's `SLURM_*` variables but sets its own.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Option<LaunchEnv> {
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<usize>().ok());
        let candidates = [
            (
                Launcher::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ),
            // Only a job step's tasks are launched ranks; the batch script itself also sees
            // SLURM_PROCID=0 and the allocation's task count, but no step id.
            (
                Launcher::Slurm,
                "SLURM_PROCID",
                "SLURM_STEP_NUM_TASKS",
                "SLURM_LOCALID",
            ),
            (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ];
        candidates
            .iter()
            .find_map(|&(launcher, rank, size, local)| {
                if launcher == Launcher::Slurm && get("SLURM_STEP_ID").is_none() {
                    return None;
                }
                let (rank, size) = (num(rank)?, num(size)?);
                (rank < size).then_some(LaunchEnv {
                    launcher,
                    rank,
                    size,
                    local_rank: num(local),
                })
            })
    }

    /// Checks the launcher's view against MPI's world (`mpi_rank` of `mpi_size`). A launcher that
    /// started more processes than MPI sees means every process is its own world of one.
    pub fn check_world(&self, mpi_rank: usize, mpi_size: usize) -> Result<()> {
        if self.size == mpi_size && self.rank == mpi_rank {
            return Ok(());
        }
        let hint = match self.launcher {
            Launcher::Slurm => {
                "srun's MPI plugin did not connect the tasks: run `srun --mpi=pmix` (see `srun \
                 --mpi=list`) or `mpirun` inside the allocation"
            }
            Launcher::OpenMpi => {
                "the process was started by one MPI's mpirun but linked against another MPI"
            }
            Launcher::Torchrun => {
                "torchrun does not start MPI jobs: launch p2ptrain with mpirun or srun"
            }
        };
        Err(Error::Usage(format!(
            "{} started this process as rank {} of {}, but MPI sees rank {mpi_rank} of a world of \
             {mpi_size}: each process would train alone. {hint}",
            self.launcher.name(),
            self.rank,
            self.size
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Option<LaunchEnv> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn reads_each_launcher() {
        let ompi = env(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ]);
        assert_eq!(
            ompi,
            Some(LaunchEnv {
                launcher: Launcher::OpenMpi,
                rank: 3,
                size: 4,
                local_rank: Some(1)
            })
        );
        let srun = env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_ID", "0"),
        ])
        .unwrap();
        assert_eq!(
            (srun.launcher, srun.rank, srun.size, srun.local_rank),
            (Launcher::Slurm, 5, 8, Some(1))
        );
        let torch = env(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap();
        assert_eq!(
            (torch.launcher, torch.local_rank),
            (Launcher::Torchrun, None)
        );
    }

    #[test]
    fn mpirun_inside_an_allocation_wins_over_the_allocation() {
        let e = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_NUM_TASKS", "16"),
            ("SLURM_STEP_ID", "0"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ])
        .unwrap();
        assert_eq!((e.launcher, e.rank, e.size), (Launcher::OpenMpi, 2, 4));
    }

    #[test]
    fn a_batch_script_or_garbage_is_no_launcher() {
        assert_eq!(env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")]), None);
        assert_eq!(env(&[]), None);
        assert_eq!(env(&[("RANK", "x"), ("WORLD_SIZE", "2")]), None);
        assert_eq!(env(&[("RANK", "2"), ("WORLD_SIZE", "2")]), None);
    }

    #[test]
    fn singletons_under_srun_are_caught() {
        let e = env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_STEP_ID", "0"),
        ])
        .unwrap();
        let msg = e.check_world(0, 1).unwrap_err().to_string();
        assert!(
            msg.contains("srun started this process as rank 1 of 4"),
            "{msg}"
        );
        assert!(msg.contains("MPI sees rank 0 of a world of 1"), "{msg}");
        assert!(msg.contains("--mpi=pmix"), "{msg}");
        assert!(e.check_world(1, 4).is_ok());
    }
}
