//! The parallel trainer, after NVIDIA Caffe: one `P2PManager` per process owns the resolved plan
//! and starts one `P2PSync` thread per local replica; each `P2PSync` runs its own net, solver and
//! data shard and talks to the others through its `Communicator`; `SharedScores` turns the
//! replicas' local loss and accuracy into global figures; `local_sgd` schedules local SGD's
//! averagings, `agreement` the signal agreements of synchronous training.

pub mod agreement;
pub mod bucket;
pub mod cpu_engine;
pub mod engine;
pub mod fault;
pub mod gpu_engine;
pub mod local_sgd;
pub mod manager;
pub mod reducer;
pub mod scores;
pub mod sync;
pub mod timeline;
pub mod timing;
pub mod verify;

pub use engine::Engine;
pub use manager::{Mode, P2PManager, RunReport};
pub use scores::SharedScores;
pub use sync::{Outputs, P2PSync, TestResult};
