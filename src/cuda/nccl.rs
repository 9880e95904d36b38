//! NCCL for the GPU replicas: the unique id made by global rank 0 and sent to every rank through
//! MPI ([`NcclId::shared`]), and [`NcclComm`], one replica's communicator over its device, with
//! the collectives the trainer needs — in-place all-reduce (average or sum) over a sub-range of a
//! device buffer on a given stream (FP32 and FP64, and bfloat16 held as its 16-bit patterns for
//! the gradient wire of `cluster.reduce_dtype = "bf16"`), in-place broadcast, a synchronising sum of host `f64`
//! (scores, timings), and a synchronising all-gather of host bytes (set-up exchanges).
//!
//! Where the host waits for NCCL work ([`NcclComm::synchronize`]: the score sums, and the
//! engine's display, test, snapshot and end-of-run points), it polls an event together with
//! `ncclCommGetAsyncError` and the collective deadline (`[cluster] collective_timeout_s`); on an
//! asynchronous error or at the deadline it aborts the communicator (`ncclCommAbort`) and ends
//! the whole job, naming the collective, the iteration and the silent ranks
//! ([`crate::dist::deadline`]).
//!
//! Each replica creates its communicator on its own thread, with its universal rank
//! (`MPI rank × replicas_per_rank + local index`); [`NcclComm`] is not `Send`, so it stays there.
//! Replicas of one process initialise concurrently from their own threads, which needs no NCCL
//! group (a group is only needed when one thread initialises several communicators).
//!
//! # How the library is found
//!
//! cudarc 0.19's dynamic loader (`cudarc::nccl::sys::culib`, through
//! `cudarc::get_lib_name_candidates("nccl")`) dlopens bare names only — `libnccl.so`,
//! `libnccl64*.so`, `libnccl.so.<CUDA major>` (13 here), `.so.12`, `.so.11`, `.so.10`, `.so.9`,
//! `.so.1` — honours no environment variable, and keeps the library in a private `OnceLock` that
//! cannot be handed a handle. `libnccl.so.2`, the name of the NCCL runtime packages (`libnccl2`,
//! the `nvidia-nccl-cu*` wheels), is not among them, and loading it first does not help: glibc
//! matches a later `dlopen("libnccl.so")` against the names and SONAME (`libnccl.so.2`) of
//! loaded objects, not against their files, and `LD_LIBRARY_PATH` is read once at process start.
//! So this module does not go through cudarc for NCCL: it dlopens the library itself and binds
//! the dozen functions it calls, with the types of NCCL's stable 2.x ABI. It tries, in order:
//!
//! 1. `$P2PTRAIN_NCCL_LIBRARY` if set (a path, or a name searched as `dlopen` does), and nothing
//!    else;
//! 2. `libnccl.so.2` (the runtime's name);
//! 3. `libnccl.so` (the development symlink).
//!
//! Names are searched by `dlopen`: `LD_LIBRARY_PATH`, the `ld.so` cache, `/lib`, `/usr/lib`.
//! Should another part of the program load NCCL through cudarc as well, and its name lead to the
//! same file, glibc maps that file once and both see one library. NCCL 2.10 or newer is required
//! (`ncclAvg`).
//!
//! ```no_run
//! # fn main() -> p2ptrain::error::Result<()> {
//! use cudarc::driver::CudaContext;
//! use p2ptrain::cuda::nccl::{NcclComm, NcclId};
//! let ctx = CudaContext::new(0).unwrap();
//! let stream = ctx.new_stream().unwrap();
//! let id = NcclId::new()?; // one replica; with MPI: NcclId::shared(&boot)?
//! let comm = NcclComm::from_id(stream.clone(), 0, 1, id)?;
//! let mut grad = stream.clone_htod(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
//! comm.all_reduce_avg(&mut grad, 1..3, &stream)?; // floats 1 and 2 only
//! stream.synchronize().unwrap();
//! comm.finish()?; // after the last collective
//! # Ok(())
//! # }
//! ```

use crate::dist::abort_hooks::{self, Registration};
use crate::dist::deadline::{self, Wait};
use crate::dist::nodes::Nodes;
use crate::dist::Bootstrap;
use crate::error::{Error, Result};
use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The environment variable that names the NCCL library to load (a path or a file name).
pub const LIBRARY_ENV: &str = "P2PTRAIN_NCCL_LIBRARY";

/// Names tried when [`LIBRARY_ENV`] is not set, in order.
pub const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Oldest NCCL accepted: 2.10 introduced `ncclAvg`.
const MIN_VERSION: c_int = 21000;

/// Bytes of an `ncclUniqueId`.
pub const ID_BYTES: usize = 128;

// ---- The C ABI of NCCL 2.x (nccl.h); these values have been stable since 2.10. ----

type RawComm = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct RawId {
    internal: [c_char; ID_BYTES],
}

/// `ncclDataType_t` values.
const NCCL_UINT8: c_int = 1;
const NCCL_FLOAT32: c_int = 7;
const NCCL_FLOAT64: c_int = 8;
const NCCL_BFLOAT16: c_int = 9;

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueIdFn = unsafe extern "C" fn(*mut RawId) -> c_int;
type CommInitRankFn = unsafe extern "C" fn(*mut RawComm, c_int, RawId, c_int) -> c_int;
type CommFn = unsafe extern "C" fn(RawComm) -> c_int;
type CommGetAsyncErrorFn = unsafe extern "C" fn(RawComm, *mut c_int) -> c_int;
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    CUstream,
) -> c_int;
type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    CUstream,
) -> c_int;
type AllGatherFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, CUstream) -> c_int;
type GetErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type GetLastErrorFn = unsafe extern "C" fn(RawComm) -> *const c_char;

/// The loaded library: its functions, resolved once per process.
struct Lib {
    /// The name or path it was loaded from.
    name: String,
    /// `major × 10000 + minor × 100 + patch`.
    version: c_int,
    get_unique_id: GetUniqueIdFn,
    comm_init_rank: CommInitRankFn,
    comm_abort: CommFn,
    comm_destroy: CommFn,
    /// `ncclCommFinalize`, NCCL 2.14+ (before it, `ncclCommDestroy` flushed by itself).
    comm_finalize: Option<CommFn>,
    comm_get_async_error: CommGetAsyncErrorFn,
    all_reduce: AllReduceFn,
    broadcast: BroadcastFn,
    all_gather: AllGatherFn,
    get_error_string: GetErrorStringFn,
    /// `ncclGetLastError`, NCCL 2.13+.
    get_last_error: Option<GetLastErrorFn>,
}

/// The library, loaded on first use; the error says every name tried and why it failed.
fn lib() -> Result<&'static Lib> {
    static LIB: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load)
        .as_ref()
        .map_err(|e| Error::Comm(e.clone()))
}

/// The last `dlerror()` message of this thread.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    }
}

fn load() -> std::result::Result<Lib, String> {
    let names: Vec<String> = match std::env::var(LIBRARY_ENV) {
        Ok(name) if !name.is_empty() => vec![name],
        _ => LIBRARY_NAMES.iter().map(|s| s.to_string()).collect(),
    };
    let mut tried = Vec::new();
    for name in &names {
        let Ok(c_name) = CString::new(name.as_bytes()) else {
            tried.push(format!("{name}: contains a NUL byte"));
            continue;
        };
        // SAFETY: dlopen with a valid C string; NCCL's initialisers are safe to run. The handle
        // is never closed: the functions stay valid for the life of the process.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            tried.push(dl_error());
            continue;
        }
        return bind(handle, name).map_err(|e| format!("NCCL library {name}: {e}"));
    }
    Err(format!(
        "NCCL: cannot load the library (tried {}); install NCCL 2.10 or newer, add its directory \
         to LD_LIBRARY_PATH, or name the file in {LIBRARY_ENV}",
        tried.join("; ")
    ))
}

/// Looks `symbol` up in `handle` as a function of type `F`.
///
/// # Safety
/// `F` must be the `extern "C"` function-pointer type of `symbol` in the loaded library.
unsafe fn symbol<F: Copy>(handle: *mut c_void, symbol: &str) -> std::result::Result<F, String> {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    let c_name = CString::new(symbol).expect("symbol names have no NUL");
    // SAFETY: valid handle and C string.
    let ptr = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
    if ptr.is_null() {
        return Err(format!("missing symbol {symbol}: {}", dl_error()));
    }
    // SAFETY: same size (asserted); the caller guarantees the signature.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&ptr) })
}

fn bind(handle: *mut c_void, name: &str) -> std::result::Result<Lib, String> {
    // SAFETY: each type below is the declaration of the symbol in nccl.h (2.10 – 2.28).
    unsafe {
        let get_version: GetVersionFn = symbol(handle, "ncclGetVersion")?;
        let mut version = 0;
        let rc = get_version(&mut version);
        if rc != 0 {
            return Err(format!("ncclGetVersion returned {rc}"));
        }
        if version < MIN_VERSION {
            return Err(format!(
                "version {} is too old: p2ptrain needs NCCL 2.10 or newer (ncclAvg)",
                version_string(version)
            ));
        }
        Ok(Lib {
            name: name.to_string(),
            version,
            get_unique_id: symbol(handle, "ncclGetUniqueId")?,
            comm_init_rank: symbol(handle, "ncclCommInitRank")?,
            comm_abort: symbol(handle, "ncclCommAbort")?,
            comm_destroy: symbol(handle, "ncclCommDestroy")?,
            comm_finalize: symbol(handle, "ncclCommFinalize").ok(),
            comm_get_async_error: symbol(handle, "ncclCommGetAsyncError")?,
            all_reduce: symbol(handle, "ncclAllReduce")?,
            broadcast: symbol(handle, "ncclBroadcast")?,
            all_gather: symbol(handle, "ncclAllGather")?,
            get_error_string: symbol(handle, "ncclGetErrorString")?,
            get_last_error: symbol(handle, "ncclGetLastError").ok(),
        })
    }
}

/// `22803` → `2.28.3`.
fn version_string(code: c_int) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

/// The symbolic name of an `ncclResult_t`.
fn result_name(code: c_int) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "unknown ncclResult_t",
    }
}

impl Lib {
    /// `Ok` for `ncclSuccess`, otherwise an error naming `op`, the result and NCCL's own
    /// explanation (with the communicator's last error message when there is one).
    fn check(&self, op: &str, code: c_int, comm: Option<RawComm>) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { (self.get_error_string)(code) };
        let mut msg = format!("NCCL {op} failed: {} ({code})", result_name(code));
        if !text.is_null() {
            // SAFETY: non-null, static, NUL-terminated.
            let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
            msg.push_str(&format!(": {text}"));
        }
        if let (Some(last), Some(comm)) = (self.get_last_error, comm) {
            // SAFETY: `comm` is a live communicator; the string is owned by NCCL and copied.
            let detail = unsafe { last(comm) };
            if !detail.is_null() {
                // SAFETY: non-null, NUL-terminated.
                let detail = unsafe { CStr::from_ptr(detail) }.to_string_lossy();
                if !detail.is_empty() {
                    msg.push_str(&format!(" — {detail}"));
                }
            }
        }
        Err(Error::Comm(msg))
    }
}

/// Whether NCCL can be used: the library loads, has every function needed and is 2.10 or newer.
/// Says nothing about devices (see `crate::cuda::available`).
pub fn nccl_available() -> bool {
    lib().is_ok()
}

/// The loaded NCCL's version as `(major, minor, patch)`.
pub fn nccl_version() -> Result<(u32, u32, u32)> {
    let v = lib()?.version as u32;
    Ok((v / 10000, v / 100 % 100, v % 100))
}

/// The name or path NCCL was loaded from, e.g. `libnccl.so.2`.
pub fn nccl_library() -> Result<&'static str> {
    Ok(&lib()?.name)
}

/// An `ncclUniqueId`: the 128 bytes from which every replica joins the same communicator.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId {
    bytes: [u8; ID_BYTES],
}

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The bytes are an opaque handle (an address); a short prefix is enough to compare.
        let head: String = self.bytes[..8].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "NcclId({head}…)")
    }
}

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`). Only one replica of the job makes it; the others receive
    /// its bytes.
    pub fn new() -> Result<Self> {
        let lib = lib()?;
        let mut raw = RawId {
            internal: [0; ID_BYTES],
        };
        // SAFETY: `raw` is a valid, writable ncclUniqueId.
        lib.check(
            "ncclGetUniqueId",
            unsafe { (lib.get_unique_id)(&mut raw) },
            None,
        )?;
        Ok(NcclId {
            bytes: raw.internal.map(|c| c as u8),
        })
    }

    /// The id from its bytes, as received from the replica that made it.
    pub fn from_bytes(bytes: [u8; ID_BYTES]) -> Self {
        NcclId { bytes }
    }

    /// The bytes to send to the other replicas.
    pub fn as_bytes(&self) -> &[u8; ID_BYTES] {
        &self.bytes
    }

    /// The job's id: MPI rank 0 makes it and broadcasts its bytes to every rank. Call on the
    /// main thread of every rank. If rank 0 fails, every rank returns an error (rank 0 its own,
    /// naming the cause) and nobody is left waiting.
    pub fn shared(boot: &Bootstrap) -> Result<Self> {
        let mine = if boot.rank == 0 {
            Some(NcclId::new())
        } else {
            None
        };
        // Byte 0: 1 if rank 0 made an id; then the id.
        let mut msg = [0u8; 1 + ID_BYTES];
        if let Some(Ok(id)) = &mine {
            msg[0] = 1;
            msg[1..].copy_from_slice(id.as_bytes());
        }
        boot.broadcast_bytes(&mut msg, 0);
        match mine {
            Some(result) => result,
            None if msg[0] == 1 => {
                let mut bytes = [0u8; ID_BYTES];
                bytes.copy_from_slice(&msg[1..]);
                Ok(NcclId::from_bytes(bytes))
            }
            None => Err(Error::Comm(
                "rank 0 could not create the NCCL unique id (see its error)".into(),
            )),
        }
    }

    /// The id of this process's node (local SGD's node scope): the node's first rank makes one,
    /// every rank gathers them all (17 words each, through MPI) and takes its node's. Call on
    /// the main thread of every rank; if a node's first rank fails, that node's ranks return an
    /// error.
    pub fn per_node(boot: &Bootstrap, nodes: &Nodes) -> Result<Self> {
        const WORDS: usize = 1 + ID_BYTES / 8;
        let first = nodes.ranks_of(nodes.of_rank[boot.rank])[0];
        let mine = (first == boot.rank).then(NcclId::new);
        // Word 0: 1 if the rank made an id; then the id's bytes.
        let mut words = [0u64; WORDS];
        if let Some(Ok(id)) = &mine {
            words[0] = 1;
            for (w, b) in words[1..].iter_mut().zip(id.bytes.chunks_exact(8)) {
                *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            }
        }
        let all = boot.all_gather_u64(&words);
        let theirs = &all[first * WORDS..(first + 1) * WORDS];
        match mine {
            Some(result) => result,
            None if theirs[0] == 1 => {
                let mut bytes = [0u8; ID_BYTES];
                for (b, w) in bytes.chunks_exact_mut(8).zip(&theirs[1..]) {
                    b.copy_from_slice(&w.to_le_bytes());
                }
                Ok(NcclId::from_bytes(bytes))
            }
            None => Err(Error::Comm(format!(
                "rank {first} could not create its node's NCCL unique id (see its error)"
            ))),
        }
    }

    fn raw(&self) -> RawId {
        RawId {
            internal: self.bytes.map(|b| b as c_char),
        }
    }
}

/// The reductions of [`NcclComm::all_reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// Sum divided by the number of replicas (NCCL's `ncclAvg`: for floats, each input is
    /// multiplied by `1/n` before the sum).
    Avg,
}

impl ReduceOp {
    /// The `ncclRedOp_t` value.
    fn raw(self) -> c_int {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
        }
    }
}

/// Element types NCCL reduces here.
pub trait NcclType: DeviceRepr {
    /// The `ncclDataType_t` value.
    const DATA_TYPE: c_int;
}

impl NcclType for f32 {
    const DATA_TYPE: c_int = NCCL_FLOAT32;
}

impl NcclType for f64 {
    const DATA_TYPE: c_int = NCCL_FLOAT64;
}

/// One replica's NCCL communicator over its device.
///
/// Collectives are enqueued on the stream passed to each call (or, for [`Self::sum_f64`], on the
/// communicator's own stream) and return without waiting; every replica must issue the same
/// collectives in the same order. Ordering against other streams is the caller's: record an
/// event where the data is produced and make the communication stream wait on it.
///
/// At the normal end of a run, call [`Self::finish`]: it flushes the communicator's last
/// operations (a network proxy may still be sending when the device is done) and frees it.
/// Dropping it without `finish` aborts it (`ncclCommAbort`), which never waits for peers: a
/// replica that fails must not hang in its destructor while its peers wait for the job to end.
pub struct NcclComm {
    lib: &'static Lib,
    raw: RawComm,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
    /// Device buffer of [`Self::sum_f64`], grown on demand.
    scratch: Option<CudaSlice<f64>>,
    /// Recorded where the host waits ([`Self::synchronize`]) and polled.
    done: CudaEvent,
    /// Set by whoever releases the communicator first: [`Self::finish`], `Drop`, or the job's
    /// abort ([`crate::dist::abort_hooks`]), which may run on another thread.
    released: Arc<AtomicBool>,
    /// Aborts the communicator if the process ends the job on an error (so that no kernel is
    /// left waiting on a stopped peer); unregistered when the communicator is released.
    _on_job_abort: Registration,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device())
            .finish()
    }
}

impl NcclComm {
    /// Joins the communicator of `size` replicas identified by `id` as universal rank `rank`, on
    /// the device of `stream` (`ncclCommInitRank`). Blocks until every replica has joined. Call
    /// it on the replica's own thread; `stream` becomes the communicator's own stream (used by
    /// [`Self::sum_f64`]).
    pub fn from_id(stream: Arc<CudaStream>, rank: usize, size: usize, id: NcclId) -> Result<Self> {
        let lib = lib()?;
        if size == 0 || rank >= size || c_int::try_from(size).is_err() {
            return Err(Error::Comm(format!(
                "NCCL: rank {rank} of {size} replicas is not a valid place in a communicator"
            )));
        }
        // ncclCommInitRank uses the calling thread's current device.
        stream.context().bind_to_thread().map_err(|e| {
            Error::Comm(format!(
                "CUDA: binding device {} to the replica thread: {e}",
                stream.context().ordinal()
            ))
        })?;
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: `raw` is writable; size and rank were checked to fit a C int.
        let rc = unsafe { (lib.comm_init_rank)(&mut raw, size as c_int, id.raw(), rank as c_int) };
        lib.check(
            &format!(
                "ncclCommInitRank (rank {rank} of {size}, device {})",
                stream.context().ordinal()
            ),
            rc,
            None,
        )?;
        let done = match stream.context().new_event(None) {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: the communicator was just created and is released once.
                let _ = unsafe { (lib.comm_abort)(raw) };
                return Err(Error::Comm(format!(
                    "CUDA: creating an event for NCCL: {e}"
                )));
            }
        };
        let released = Arc::new(AtomicBool::new(false));
        let on_job_abort = {
            let (released, ctx, raw) = (released.clone(), stream.context().clone(), raw as usize);
            abort_hooks::register(move || {
                if !released.swap(true, Ordering::SeqCst) {
                    let _ = ctx.bind_to_thread();
                    // SAFETY: the communicator is live (`released` was not set) and is never
                    // used again: the process is ending the job.
                    let _ = unsafe { (lib.comm_abort)(raw as RawComm) };
                }
            })
        };
        Ok(NcclComm {
            lib,
            raw,
            stream,
            rank,
            size,
            scratch: None,
            done,
            released,
            _on_job_abort: on_job_abort,
        })
    }

    /// Universal rank of this replica.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of replicas.
    pub fn size(&self) -> usize {
        self.size
    }

    /// CUDA ordinal of this replica's device.
    pub fn device(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// The communicator's own stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Checks that `stream` is on this communicator's device.
    fn check_stream(&self, op: &str, stream: &CudaStream) -> Result<()> {
        let theirs = stream.context().ordinal();
        if theirs != self.device() {
            return Err(Error::Comm(format!(
                "NCCL {op}: stream of device {theirs} given to the communicator of device {}",
                self.device()
            )));
        }
        Ok(())
    }

    /// Replaces `buf[range]` by its element-wise mean over every replica, in place, enqueued on
    /// `stream` (which must belong to this communicator's device).
    pub fn all_reduce_avg(
        &self,
        buf: &mut CudaSlice<f32>,
        range: Range<usize>,
        stream: &CudaStream,
    ) -> Result<()> {
        self.all_reduce(buf, range, ReduceOp::Avg, stream)
    }

    /// Replaces `buf[range]` by its element-wise reduction `op` over every replica, in place,
    /// enqueued on `stream`.
    pub fn all_reduce<T: NcclType>(
        &self,
        buf: &mut CudaSlice<T>,
        range: Range<usize>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        self.all_reduce_as(buf, range, T::DATA_TYPE, op, stream)
    }

    /// [`Self::all_reduce`] of bfloat16 numbers held as their bit patterns (`ncclBfloat16`; NCCL
    /// adds two of them with one rounding to nearest, ties to even, as
    /// `crate::dist::wire::add`).
    pub fn all_reduce_bf16(
        &self,
        buf: &mut CudaSlice<u16>,
        range: Range<usize>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        self.all_reduce_as(buf, range, NCCL_BFLOAT16, op, stream)
    }

    /// The in-place `ncclAllReduce` of `buf[range]`, whose elements NCCL reads as `data_type`
    /// (of `T`'s size).
    fn all_reduce_as<T: DeviceRepr>(
        &self,
        buf: &mut CudaSlice<T>,
        range: Range<usize>,
        data_type: c_int,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<()> {
        let name = "ncclAllReduce";
        self.check_stream(name, stream)?;
        in_place(name, buf, &range, stream, |ptr| {
            // SAFETY: `ptr` addresses `range.len()` elements of T on this communicator's device,
            // kept alive and exclusively borrowed for the call, and `data_type` has T's size (the
            // callers pair them); in-place is allowed by NCCL.
            let rc = unsafe {
                (self.lib.all_reduce)(
                    ptr,
                    ptr,
                    range.len(),
                    data_type,
                    op.raw(),
                    self.raw,
                    stream.cu_stream(),
                )
            };
            self.lib.check(name, rc, Some(self.raw))
        })
    }

    /// Copies `buf[range]` of universal rank `root` into every replica's `buf[range]`, in place,
    /// enqueued on `stream`.
    pub fn broadcast<T: NcclType>(
        &self,
        buf: &mut CudaSlice<T>,
        range: Range<usize>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let name = "ncclBroadcast";
        self.check_stream(name, stream)?;
        if root >= self.size {
            return Err(Error::Comm(format!(
                "NCCL {name}: root {root} is not a rank of {} replicas",
                self.size
            )));
        }
        in_place(name, buf, &range, stream, |ptr| {
            // SAFETY: as in `all_reduce`; root < size fits a C int.
            let rc = unsafe {
                (self.lib.broadcast)(
                    ptr,
                    ptr,
                    range.len(),
                    T::DATA_TYPE,
                    root as c_int,
                    self.raw,
                    stream.cu_stream(),
                )
            };
            self.lib.check(name, rc, Some(self.raw))
        })
    }

    /// Replaces the host values `values` by their sums over every replica (scores, counters).
    /// Runs on the communicator's own stream and waits for the result.
    pub fn sum_f64(&mut self, values: &mut [f64]) -> Result<()> {
        let n = values.len();
        if n == 0 {
            return Ok(());
        }
        let cuda = |op: &str, e: cudarc::driver::DriverError| {
            Error::Comm(format!("CUDA {op} (NCCL score sum): {e}"))
        };
        let stream = self.stream.clone();
        let mut scratch = match self.scratch.take() {
            Some(s) if s.len() >= n => s,
            _ => stream.alloc_zeros::<f64>(n).map_err(|e| cuda("alloc", e))?,
        };
        stream
            .memcpy_htod(values, &mut scratch.slice_mut(..n))
            .map_err(|e| cuda("copy to device", e))?;
        self.all_reduce(&mut scratch, 0..n, ReduceOp::Sum, &stream)?;
        // A copy into pageable host memory blocks until the sum is done, without a deadline: the
        // stream is waited for first, polling (a peer may have stopped), and the copy is quick.
        self.synchronize(&stream, "score sum")?;
        stream
            .memcpy_dtoh(&scratch.slice(..n), values)
            .map_err(|e| cuda("copy to host", e))?;
        self.scratch = Some(scratch);
        Ok(())
    }

    /// Every replica's `mine` in rank order, concatenated (`ncclAllGather` of bytes): what set-up
    /// exchanges, such as the addresses of `crate::cuda::peer_wire`. Every replica passes the
    /// same length. Runs on the communicator's own stream and waits for the result.
    pub fn gather_bytes(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let name = "ncclAllGather";
        let cuda = |op: &str, e: cudarc::driver::DriverError| {
            Error::Comm(format!("CUDA {op} (NCCL all-gather of set-up data): {e}"))
        };
        let (n, stream) = (mine.len(), self.stream.clone());
        let mut all = vec![0u8; n * self.size];
        if n == 0 {
            return Ok(all);
        }
        let send = stream
            .clone_htod(mine)
            .map_err(|e| cuda("copy to device", e))?;
        let mut recv = stream
            .alloc_zeros::<u8>(n * self.size)
            .map_err(|e| cuda("alloc", e))?;
        {
            let (src, _r) = send.device_ptr(&stream);
            let (dst, _w) = recv.device_ptr_mut(&stream);
            // SAFETY: `src` holds `n` bytes and `dst` `n × size` on this communicator's device,
            // both alive and borrowed for the call.
            let rc = unsafe {
                (self.lib.all_gather)(
                    src as *const c_void,
                    dst as *mut c_void,
                    n,
                    NCCL_UINT8,
                    self.raw,
                    stream.cu_stream(),
                )
            };
            self.lib.check(name, rc, Some(self.raw))?;
        }
        self.synchronize(&stream, "set-up all-gather")?;
        stream
            .memcpy_dtoh(&recv, &mut all)
            .map_err(|e| cuda("copy to host", e))?;
        Ok(all)
    }

    /// Waits until everything enqueued so far on `stream` (a stream of this device, ordered after
    /// the NCCL work to wait for) is done, polling the communicator's asynchronous error and the
    /// collective deadline. On an asynchronous error or at the deadline the communicator is
    /// aborted and the whole job ends, the report naming collective `op`; CUDA errors return.
    pub fn synchronize(&self, stream: &CudaStream, op: &str) -> Result<()> {
        let cuda = |what: &str, e: cudarc::driver::DriverError| {
            Error::Comm(format!("CUDA {what} (waiting for `{op}`): {e}"))
        };
        self.done
            .record(stream)
            .map_err(|e| cuda("record an event", e))?;
        let mut wait = Wait::new();
        loop {
            if self.done.try_is_complete().map_err(|e| cuda("query", e))? {
                return self.check();
            }
            if let Err(e) = self.check() {
                self.abort();
                deadline::fail(op, &e.to_string());
            }
            if !wait.pause() {
                self.abort();
                deadline::expire(op, &wait, None);
            }
        }
    }

    /// `ncclCommAbort` before the job ends: never waits for peers. The communicator is not
    /// used again (the caller ends the process).
    fn abort(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: live communicator; the process ends right after, so it is not used again.
        let _ = unsafe { (self.lib.comm_abort)(self.raw) };
    }

    /// Ends the communicator cleanly once its operations are complete: `ncclCommFinalize` (which
    /// waits for them, including what peers still need from this replica), then
    /// `ncclCommDestroy`. Every replica calls it after its last collective.
    pub fn finish(mut self) -> Result<()> {
        let (lib, raw) = (self.lib, self.raw);
        // From here on `Drop` leaves the communicator alone.
        self.raw = std::ptr::null_mut();
        if self.released.swap(true, Ordering::SeqCst) {
            return Err(Error::Comm(
                "NCCL: the communicator was aborted while the job ended".into(),
            ));
        }
        let finalized = self
            .stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::Comm(format!("CUDA: binding the device to finish NCCL: {e}")))
            .and_then(|()| match lib.comm_finalize {
                // SAFETY: live communicator.
                Some(finalize) => {
                    lib.check("ncclCommFinalize", unsafe { finalize(raw) }, Some(raw))
                }
                None => Ok(()),
            });
        match finalized {
            // SAFETY: live communicator, released once.
            Ok(()) => lib.check("ncclCommDestroy", unsafe { (lib.comm_destroy)(raw) }, None),
            Err(e) => {
                // SAFETY: live communicator, released once, without waiting for anyone.
                let _ = unsafe { (lib.comm_abort)(raw) };
                Err(e)
            }
        }
    }

    /// An error if the communicator failed asynchronously (a peer died, a network error):
    /// `ncclCommGetAsyncError`. A failed communicator can only be dropped.
    pub fn check(&self) -> Result<()> {
        let mut state: c_int = 0;
        // SAFETY: live communicator, writable result.
        let rc = unsafe { (self.lib.comm_get_async_error)(self.raw, &mut state) };
        self.lib
            .check("ncclCommGetAsyncError", rc, Some(self.raw))?;
        self.lib
            .check("communication (asynchronous error)", state, Some(self.raw))
    }
}

/// Calls `collective` with the device address of `buf[range]`, which an in-place collective
/// reads and writes, held on `stream` until the call returns; calls nothing for an empty range.
/// `op` names the collective in the error for a range outside `buf`.
fn in_place<T: DeviceRepr>(
    op: &str,
    buf: &mut CudaSlice<T>,
    range: &Range<usize>,
    stream: &CudaStream,
    collective: impl FnOnce(*mut c_void) -> Result<()>,
) -> Result<()> {
    let len = buf.len();
    let Some(mut view) = buf.try_slice_mut(range.clone()) else {
        return Err(out_of_range(op, range, len));
    };
    if range.is_empty() {
        return Ok(());
    }
    let (ptr, _record) = view.device_ptr_mut(stream);
    collective(ptr as *mut c_void)
}

fn out_of_range(op: &str, range: &Range<usize>, len: usize) -> Error {
    Error::Comm(format!(
        "NCCL {op}: range {}..{} outside a buffer of {len} elements",
        range.start, range.end
    ))
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.raw.is_null() || self.released.swap(true, Ordering::SeqCst) {
            return; // finished, or aborted as the job ended
        }
        // The device must be current for NCCL to release its resources; failures here cannot be
        // reported anywhere useful.
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: `raw` is a live communicator, released exactly once.
        let _ = unsafe { (self.lib.comm_abort)(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::test_util::nccl_devices_or_skip as devices_or_skip;
    use cudarc::driver::CudaContext;

    #[test]
    fn versions_read_as_nccl_prints_them() {
        assert_eq!(version_string(22803), "2.28.3");
        assert_eq!(version_string(21003), "2.10.3");
    }

    #[test]
    fn result_codes_have_names() {
        assert_eq!(result_name(2), "ncclSystemError");
        assert_eq!(result_name(6), "ncclRemoteError");
        assert_eq!(result_name(99), "unknown ncclResult_t");
    }

    #[test]
    fn id_bytes_round_trip() {
        let mut bytes = [0u8; ID_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 7 + 200) as u8; // values above 127 survive the c_char round trip
        }
        let id = NcclId::from_bytes(bytes);
        assert_eq!(id.as_bytes(), &bytes);
        let raw = id.raw();
        assert_eq!(raw.internal.map(|c| c as u8), bytes);
        assert!(format!("{id:?}").starts_with("NcclId(c8cf"));
    }

    /// Without NCCL (the CPU build machines) the probe answers false and the error names every
    /// library tried; with it, the version is at least 2.10. Either way nothing panics.
    #[test]
    fn probing_never_panics() {
        match nccl_version() {
            Ok((major, minor, _)) => {
                assert!(nccl_available());
                assert!((major, minor) >= (2, 10));
                eprintln!("NCCL {major}.{minor} from {}", nccl_library().unwrap());
            }
            Err(e) => {
                assert!(!nccl_available());
                let msg = e.to_string();
                eprintln!("NCCL not available here (GPU tests skip): {msg}");
                if std::env::var_os(LIBRARY_ENV).is_none() {
                    assert!(msg.contains("libnccl.so.2"), "{msg}");
                }
                assert!(NcclId::new().is_err());
            }
        }
    }

    #[test]
    fn one_replica_reduces_a_sub_range_in_place() {
        if !devices_or_skip(
            &format!(
                "{}::one_replica_reduces_a_sub_range_in_place",
                module_path!()
            ),
            1,
        ) {
            return;
        }
        let ctx = CudaContext::new(0).unwrap();
        let stream = ctx.new_stream().unwrap();
        let mut comm = NcclComm::from_id(stream.clone(), 0, 1, NcclId::new().unwrap()).unwrap();
        assert_eq!((comm.rank(), comm.size(), comm.device()), (0, 1, 0));
        let host: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let mut buf = stream.clone_htod(&host).unwrap();
        comm.all_reduce_avg(&mut buf, 10..20, &stream).unwrap();
        comm.all_reduce(&mut buf, 0..0, ReduceOp::Sum, &stream)
            .unwrap();
        comm.broadcast(&mut buf, 0..100, 0, &stream).unwrap();
        let back = stream.clone_dtoh(&buf).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(back, host);
        let mut scores = [1.5, 2.0];
        comm.sum_f64(&mut scores).unwrap();
        assert_eq!(scores, [1.5, 2.0]);
        let err = comm.all_reduce_avg(&mut buf, 90..101, &stream).unwrap_err();
        assert!(err.to_string().contains("outside a buffer of 100"), "{err}");
        assert!(comm.broadcast(&mut buf, 0..1, 1, &stream).is_err());
        comm.check().unwrap();
        comm.finish().unwrap();
    }

    #[test]
    fn two_replicas_on_two_devices_average_only_their_range() {
        let name = "two_replicas_on_two_devices_average_only_their_range";
        if !devices_or_skip(&format!("{}::{name}", module_path!()), 2) {
            return;
        }
        let id = NcclId::new().unwrap();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2usize)
                .map(|r| {
                    s.spawn(move || {
                        let ctx = CudaContext::new(r).unwrap();
                        let stream = ctx.new_stream().unwrap();
                        let mut comm = NcclComm::from_id(stream.clone(), r, 2, id).unwrap();
                        let host: Vec<f32> = (0..64).map(|i| (i + 100 * r) as f32).collect();
                        let mut buf = stream.clone_htod(&host).unwrap();
                        comm.all_reduce_avg(&mut buf, 16..48, &stream).unwrap();
                        let mut w = stream.clone_htod(&vec![r as f32 + 1.0; 8]).unwrap();
                        comm.broadcast(&mut w, 0..8, 1, &stream).unwrap();
                        let mut scores = [r as f64, 1.0];
                        comm.sum_f64(&mut scores).unwrap();
                        let out = (
                            stream.clone_dtoh(&buf).unwrap(),
                            stream.clone_dtoh(&w).unwrap(),
                            scores,
                        );
                        stream.synchronize().unwrap();
                        comm.finish().unwrap();
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, (buf, w, scores)) in results.iter().enumerate() {
            for (i, &got) in buf.iter().enumerate() {
                // Halves of small integers: exact whichever way NCCL averages.
                let want = if (16..48).contains(&i) {
                    i as f32 + 50.0
                } else {
                    (i + 100 * r) as f32
                };
                assert_eq!(got, want, "replica {r}, element {i}");
            }
            assert_eq!(w, &vec![2.0; 8], "broadcast from rank 1");
            assert_eq!(scores, &[1.0, 2.0]);
        }
    }
}
