//! The bfloat16 gradient wire moved by the copy engines (`cluster.reduce_transport =
//! "copy_engines"`), for replicas on the GPUs of one host: a bucket is reduce-scattered and
//! all-gathered by peer copies, which the copy engines run without taking a multiprocessor from
//! the backward pass beside them, and summed by one small kernel. NCCL's all-reduce does the same
//! traffic with kernels on the multiprocessors, which slow, and are slowed by, the GEMMs they
//! overlap (docs/design.md, "What is left" of the bf16 wire).
//!
//! # One bucket on `R` replicas
//!
//! The bucket's range of the staging buffer (bfloat16 bits at the gradient's offsets) is cut
//! into `R` slices ([`SlicePlan`]); replica `j` owns slice `j`. On replica `r`:
//!
//! 1. **Scatter.** For every peer `j`, a copy of slice `j` into `j`'s inbox (slot `r`), then a
//!    flag word written into `j`'s flags, on a copy stream of that peer's own ("lane"), ordered
//!    after the bucket's rounding on the stream that packed it.
//! 2. **Sum.** The communication stream waits until every peer's flag for this bucket holds the
//!    bucket's epoch (`cuStreamWaitValue32`, no host involved), then `sum_bf16_slices` adds the
//!    `R` terms of slice `r` in rank order, each addition rounded once to bfloat16
//!    (`crate::dist::wire::add`), over the replica's own slice.
//! 3. **Gather.** For every peer `j`, a copy of the summed slice `r` into `j`'s staging buffer at
//!    the same offsets, then a flag, on a second lane per peer; the communication stream waits
//!    for those lanes and for every peer's gather flag. The bucket's sum is then whole in the
//!    staging buffer, where NCCL's in-place all-reduce would have left it.
//!
//! A flag is the epoch of its bucket (how many times the bucket has been reduced, the same count
//! on every replica), copied from a word of the sender's memory that the lane has just written
//! (`cuStreamWriteValue32`), so that it lands after the data it announces; waits compare
//! cyclically (`CU_STREAM_WAIT_VALUE_GEQ`), so the count may wrap.
//!
//! Nothing is overwritten while a peer may still read it: a replica rounds a bucket again only
//! after its update has waited for that bucket's gather flags, which every peer sends after
//! summing, and a peer sums only after this replica's scatter copies have landed. The sum is the
//! same on every replica and for every layout of the same replicas over processes and threads.
//!
//! # Memory
//!
//! Each replica allocates one block with `cuMemAlloc` (not the stream-ordered pool, whose memory
//! cannot be shared by IPC handle): the staging buffer, `R` inbox slots of one slice per bucket
//! each, and the flag words. The replicas exchange their block's address, process id, host and
//! IPC handle through NCCL ([`NcclComm::gather_bytes`]); a peer in another process is mapped with
//! `cuIpcOpenMemHandle` (peer access enabled lazily), one in the same process is addressed
//! directly after `cuCtxEnablePeerAccess`. Replicas on different hosts are refused with an error
//! naming the key.

use super::kernels::Kernels;
use super::nccl::NcclComm;
use super::{gpu_error, Gpu};
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream};
use std::ops::Range;
use std::sync::Arc;

/// Elements a slice's length is a multiple of (128 bytes of bfloat16).
const SLICE_ALIGN: usize = 64;
/// Bytes each region of the block starts on.
const REGION_ALIGN: usize = 256;
/// Bytes of one replica's record in the set-up exchange.
const RECORD_BYTES: usize = 96;

/// Where each replica's slice of each bucket lies, the same on every replica: bucket `b`'s slices
/// are `slice_len[b]` elements each (a multiple of 64; the last ones shorter or empty), and in
/// every inbox slot the slices of the buckets lie one after another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePlan {
    replicas: usize,
    buckets: Vec<Range<usize>>,
    slice_len: Vec<usize>,
    inbox_at: Vec<usize>,
    slot_len: usize,
}

impl SlicePlan {
    /// The plan of `buckets` (ranges of the gradient) over `replicas` replicas.
    pub fn new(buckets: &[Range<usize>], replicas: usize) -> SlicePlan {
        let replicas = replicas.max(1);
        let slice_len: Vec<usize> = buckets
            .iter()
            .map(|r| r.len().div_ceil(replicas).next_multiple_of(SLICE_ALIGN))
            .collect();
        let mut inbox_at = Vec::with_capacity(buckets.len());
        let mut at = 0;
        for &len in &slice_len {
            inbox_at.push(at);
            at += len;
        }
        SlicePlan {
            replicas,
            buckets: buckets.to_vec(),
            slice_len,
            inbox_at,
            slot_len: at,
        }
    }

    /// Replicas the buckets are cut for.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// The bucket whose range is `range`.
    pub fn bucket_of(&self, range: &Range<usize>) -> Option<usize> {
        self.buckets.iter().position(|r| r == range)
    }

    /// Replica `j`'s slice of bucket `b`, as a range of the gradient (possibly empty).
    pub fn slice(&self, b: usize, j: usize) -> Range<usize> {
        let r = &self.buckets[b];
        let start = (r.start + j * self.slice_len[b]).min(r.end);
        start..(start + self.slice_len[b]).min(r.end)
    }

    /// Where bucket `b`'s slice lies in every inbox slot, in elements from the slot's start.
    pub fn inbox_at(&self, b: usize) -> usize {
        self.inbox_at[b]
    }

    /// Elements of one inbox slot.
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Bucket count.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }
}

/// Byte offsets of the regions of a replica's block (the same on every replica).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// `(gradient)` bfloat16 staging buffer, at 0.
    staging_len: usize,
    /// `(R, slot)` bfloat16 inbox.
    inbox: usize,
    /// `(2, buckets, R)` u32 flags peers write: phase, bucket, sender.
    flags: usize,
    /// `(2, buckets, R)` u32 words a lane writes before copying one to a peer: phase, bucket,
    /// receiver.
    sources: usize,
    total: usize,
}

impl Layout {
    fn new(gradient: usize, plan: &SlicePlan) -> Layout {
        let words = 2 * plan.buckets() * plan.replicas * 4;
        let inbox = (gradient.max(1) * 2).next_multiple_of(REGION_ALIGN);
        let flags = inbox + (plan.replicas * plan.slot_len * 2).next_multiple_of(REGION_ALIGN);
        let sources = flags + words.next_multiple_of(REGION_ALIGN);
        Layout {
            staging_len: gradient.max(1),
            inbox,
            flags,
            sources,
            total: sources + words.next_multiple_of(REGION_ALIGN),
        }
    }
}

/// The index of a flag or source word: `phase` (0 scatter, 1 gather), bucket `b`, replica `s`.
fn word(plan: &SlicePlan, phase: usize, b: usize, s: usize) -> usize {
    (phase * plan.buckets() + b) * plan.replicas + s
}

/// What a replica tells the others at set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    host: u64,
    pid: u32,
    ordinal: u32,
    base: u64,
    total: u64,
    handle: [u8; 64],
}

impl Record {
    fn to_bytes(self) -> [u8; RECORD_BYTES] {
        let mut out = [0u8; RECORD_BYTES];
        out[0..8].copy_from_slice(&self.host.to_le_bytes());
        out[8..12].copy_from_slice(&self.pid.to_le_bytes());
        out[12..16].copy_from_slice(&self.ordinal.to_le_bytes());
        out[16..24].copy_from_slice(&self.base.to_le_bytes());
        out[24..32].copy_from_slice(&self.total.to_le_bytes());
        out[32..96].copy_from_slice(&self.handle);
        out
    }

    fn from_bytes(b: &[u8]) -> Record {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&b[32..96]);
        Record {
            host: u64_at(0),
            pid: u32_at(8),
            ordinal: u32_at(12),
            base: u64_at(16),
            total: u64_at(24),
            handle,
        }
    }
}

/// This host's identity: its name and the kernel's boot id (FNV-1a), equal exactly for processes
/// of one running system.
fn host_key() -> u64 {
    let mut name = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates within it or
    // truncates, and only the bytes before the first NUL are read.
    let got = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    let name_len = if got == 0 {
        name.iter().position(|&c| c == 0).unwrap_or(name.len())
    } else {
        0
    };
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in name[..name_len].iter().chain(&[0u8]).chain(&boot) {
        h = (h ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn driver(op: &str, rc: CUresult) -> Result<()> {
    rc.result().map_err(|e| gpu_error(op, e))
}

/// The copy streams towards one peer.
struct Lanes {
    /// This replica's slices of each bucket, to the peer's inbox.
    scatter: Arc<CudaStream>,
    /// The peer's summed slice, to every replica's staging buffer.
    gather: Arc<CudaStream>,
    /// Recorded on `gather` and waited for by the communication stream.
    join: CudaEvent,
}

impl Lanes {
    fn new(ctx: &Arc<CudaContext>) -> Result<Lanes> {
        let lane = || {
            ctx.new_stream()
                .map_err(|e| gpu_error("create a copy-engine lane", e))
        };
        Ok(Lanes {
            scatter: lane()?,
            gather: lane()?,
            join: ctx
                .new_event(None)
                .map_err(|e| gpu_error("create a copy-engine lane's event", e))?,
        })
    }
}

/// One replica's side of the copy-engine wire.
pub struct PeerWire {
    plan: SlicePlan,
    rank: usize,
    ctx: Arc<CudaContext>,
    layout: Layout,
    /// This replica's block.
    block: CUdeviceptr,
    /// Per replica (this one included), its block's base as this process addresses it.
    bases: Vec<CUdeviceptr>,
    /// Bases mapped from IPC handles, unmapped on drop.
    opened: Vec<CUdeviceptr>,
    /// Per replica, the streams of the copies to it (`None` for this one).
    lanes: Vec<Option<Lanes>>,
    /// Recorded after a bucket's rounding (scatter lanes wait for it) and after its sum (gather
    /// lanes wait for it); each wait captures the record before it.
    fork: CudaEvent,
    /// Per bucket, how many times it has been reduced (the flags' values).
    epochs: Vec<u32>,
    /// The staging buffer over the block's first region (leaked on drop: the block owns it).
    staging: Option<CudaSlice<u16>>,
    /// The inbox region.
    inbox: Option<CudaSlice<u16>>,
}

impl PeerWire {
    /// Sets up the wire of the replica of `comm` (universal rank `comm.rank()`) for a gradient of
    /// `gradient` floats cut into `buckets`: allocates the block, exchanges addresses with every
    /// replica through `comm` (a collective: every replica calls it), and maps the peers' blocks.
    pub fn new(
        gpu: &Gpu,
        comm: &NcclComm,
        buckets: &[Range<usize>],
        gradient: usize,
    ) -> Result<PeerWire> {
        let (rank, replicas) = (comm.rank(), comm.size());
        let plan = SlicePlan::new(buckets, replicas);
        let layout = Layout::new(gradient, &plan);
        let ctx = gpu.ctx.clone();
        ctx.bind_to_thread()
            .map_err(|e| gpu_error("bind the device", e))?;
        let mut block: CUdeviceptr = 0;
        // SAFETY: the context is current; `block` receives the allocation.
        driver("cuMemAlloc (copy-engine wire block)", unsafe {
            sys::cuMemAlloc_v2(&mut block, layout.total)
        })?;
        let mut wire = PeerWire {
            plan,
            rank,
            ctx: ctx.clone(),
            layout,
            block,
            bases: vec![0; replicas],
            opened: Vec::new(),
            lanes: Vec::new(),
            fork: ctx
                .new_event(None)
                .map_err(|e| gpu_error("create the copy-engine wire's event", e))?,
            epochs: vec![0; buckets.len()],
            staging: None,
            inbox: None,
        };
        let words = (layout.total - layout.flags) / 4;
        // SAFETY: the flag and source words lie inside the block just allocated.
        driver("cuMemsetD32 (copy-engine wire flags)", unsafe {
            sys::cuMemsetD32_v2(block + layout.flags as u64, 0, words)
        })?;
        // SAFETY: both regions lie inside the block, which outlives them (they are leaked in
        // `drop` before the block is freed).
        unsafe {
            wire.staging = Some(gpu.compute.upgrade_device_ptr(block, layout.staging_len));
            wire.inbox = Some(gpu.compute.upgrade_device_ptr(
                block + layout.inbox as u64,
                replicas * wire.plan.slot_len().max(1),
            ));
        }
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `block` is a cuMemAlloc allocation of this context.
        driver("cuIpcGetMemHandle (copy-engine wire)", unsafe {
            sys::cuIpcGetMemHandle(&mut handle, block)
        })?;
        let mine = Record {
            host: host_key(),
            pid: std::process::id(),
            ordinal: ctx.ordinal() as u32,
            base: block,
            total: layout.total as u64,
            handle: handle.reserved.map(|c| c as u8),
        };
        let all = comm.gather_bytes(&mine.to_bytes())?;
        for s in 0..replicas {
            let peer = Record::from_bytes(&all[s * RECORD_BYTES..(s + 1) * RECORD_BYTES]);
            wire.bases[s] = wire.map_peer(s, &mine, &peer)?;
            let lanes = (s != rank).then(|| Lanes::new(&ctx)).transpose()?;
            wire.lanes.push(lanes);
        }
        Ok(wire)
    }

    /// The base address of replica `s`'s block in this process.
    fn map_peer(&mut self, s: usize, mine: &Record, peer: &Record) -> Result<CUdeviceptr> {
        if s == self.rank {
            return Ok(self.block);
        }
        if peer.host != mine.host {
            return Err(Error::Usage(format!(
                "cluster.reduce_transport = \"copy_engines\" needs every replica on one host, \
                 and replica {s} runs on another than replica {}: use reduce_transport = \
                 \"nccl\" across hosts",
                self.rank
            )));
        }
        if peer.total != mine.total {
            return Err(Error::Device(format!(
                "copy-engine wire: replica {s} laid out {} bytes, replica {} {}: the replicas \
                 built different nets",
                peer.total, self.rank, mine.total
            )));
        }
        if peer.pid == mine.pid {
            self.enable_peer_access(peer.ordinal as usize)?;
            return Ok(peer.base);
        }
        let handle = sys::CUipcMemHandle {
            reserved: peer.handle.map(|b| b as std::ffi::c_char),
        };
        let mut base: CUdeviceptr = 0;
        // SAFETY: the handle is one a process of this host exported for a live allocation; the
        // mapping is closed on drop.
        let rc = unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut base,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        };
        driver("cuIpcOpenMemHandle (a peer's copy-engine wire block)", rc).map_err(|e| {
            Error::Device(format!(
                "{e} (replica {s}, GPU {} of process {}): the copy engines need the GPUs of one \
                 host visible to one another",
                peer.ordinal, peer.pid
            ))
        })?;
        self.opened.push(base);
        Ok(base)
    }

    /// Lets this replica's context address GPU `ordinal`'s memory (same process).
    fn enable_peer_access(&self, ordinal: usize) -> Result<()> {
        let me = self.ctx.cu_device();
        let mut peer_dev: sys::CUdevice = 0;
        let mut can = 0;
        // SAFETY: plain queries with valid out-pointers.
        unsafe {
            driver(
                "cuDeviceGet",
                sys::cuDeviceGet(&mut peer_dev, ordinal as i32),
            )?;
            driver(
                "cuDeviceCanAccessPeer",
                sys::cuDeviceCanAccessPeer(&mut can, me, peer_dev),
            )?;
        }
        if can == 0 {
            return Err(Error::Usage(format!(
                "cluster.reduce_transport = \"copy_engines\": GPU {} cannot access GPU {ordinal} \
                 directly (no peer access between them); use reduce_transport = \"nccl\"",
                self.ctx.ordinal()
            )));
        }
        let mut peer_ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the primary context is retained for the call and released after; peer access
        // stays enabled while the peer replica holds its own reference.
        unsafe {
            driver(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut peer_ctx, peer_dev),
            )?;
            let rc = sys::cuCtxEnablePeerAccess(peer_ctx, 0);
            let _ = sys::cuDevicePrimaryCtxRelease_v2(peer_dev);
            if rc != CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                driver("cuCtxEnablePeerAccess", rc)?;
            }
        }
        Ok(())
    }

    /// The copy streams towards peer `j` (not this replica).
    fn lanes_to(&self, j: usize) -> &Lanes {
        self.lanes[j].as_ref().expect("a peer's lanes")
    }

    /// Replicas the wire joins.
    pub fn replicas(&self) -> usize {
        self.plan.replicas()
    }

    /// The staging buffer: `(gradient)` bfloat16 bits, at the gradient's offsets.
    pub fn staging(&self) -> &CudaSlice<u16> {
        self.staging.as_ref().expect("set in new")
    }

    /// The staging buffer, to round buckets into.
    pub fn staging_mut(&mut self) -> &mut CudaSlice<u16> {
        self.staging.as_mut().expect("set in new")
    }

    /// Sums bucket `range` (rounded into the staging buffer on `packed_on`, after everything
    /// enqueued there so far) over every replica, in place in the staging buffer; the sum is
    /// whole once `stream` (the communication stream) reaches the end of what this enqueues.
    pub fn all_reduce(
        &mut self,
        kernels: &Kernels,
        packed_on: &CudaStream,
        stream: &CudaStream,
        range: &Range<usize>,
    ) -> Result<()> {
        let b = self.plan.bucket_of(range).ok_or_else(|| {
            Error::Device(format!(
                "copy-engine wire: {}..{} is not one of the buckets it was planned for",
                range.start, range.end
            ))
        })?;
        self.epochs[b] = self.epochs[b].wrapping_add(1);
        let epoch = self.epochs[b];
        let (r, n) = (self.rank, self.replicas());
        let record = |event: &CudaEvent, on: &CudaStream| {
            event
                .record(on)
                .map_err(|e| gpu_error("record a copy-engine wire event", e))
        };
        let wait = |on: &CudaStream, event: &CudaEvent| {
            on.wait(event)
                .map_err(|e| gpu_error("wait for a copy-engine wire event", e))
        };
        // 1. Scatter: slice j to replica j's inbox, slot r.
        record(&self.fork, packed_on)?;
        for j in (1..n).map(|k| (r + k) % n) {
            let lane = &self.lanes_to(j).scatter;
            wait(lane, &self.fork)?;
            let slice = self.plan.slice(b, j);
            let to = self.bases[j]
                + (self.layout.inbox + 2 * (r * self.plan.slot_len() + self.plan.inbox_at(b)))
                    as u64;
            self.copy(
                lane,
                to,
                self.block + 2 * slice.start as u64,
                2 * slice.len(),
            )?;
            self.signal(lane, j, 0, b, epoch)?;
        }
        // 2. Sum slice r once every peer's slice has landed.
        for s in (0..n).filter(|&s| s != r) {
            self.wait_flag(stream, word(&self.plan, 0, b, s), epoch)?;
        }
        let own = self.plan.slice(b, r);
        let stride = self.plan.slot_len();
        let at = self.plan.inbox_at(b);
        let inbox = self.inbox.as_ref().expect("set in new");
        let slots = inbox.slice(at..at + (n - 1) * stride + own.len());
        let staging = self.staging.as_mut().expect("set in new");
        kernels.sum_bf16_slices(
            stream,
            &slots,
            stride,
            &mut staging.slice_mut(own.clone()),
            r,
            n,
            own.len(),
        )?;
        // 3. Gather: the summed slice r to every replica's staging buffer.
        record(&self.fork, stream)?;
        for j in (1..n).map(|k| (r + k) % n) {
            let lanes = self.lanes_to(j);
            wait(&lanes.gather, &self.fork)?;
            let from = 2 * own.start as u64;
            self.copy(
                &lanes.gather,
                self.bases[j] + from,
                self.block + from,
                2 * own.len(),
            )?;
            self.signal(&lanes.gather, j, 1, b, epoch)?;
            record(&lanes.join, &lanes.gather)?;
            wait(stream, &lanes.join)?;
        }
        for s in (0..n).filter(|&s| s != r) {
            self.wait_flag(stream, word(&self.plan, 1, b, s), epoch)?;
        }
        Ok(())
    }

    /// Copies `bytes` from `from` to `to` (device addresses of this process) on `lane`.
    fn copy(
        &self,
        lane: &CudaStream,
        to: CUdeviceptr,
        from: CUdeviceptr,
        bytes: usize,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie inside blocks mapped in this process for the wire's lifetime;
        // the protocol keeps them from being overwritten while the copy may run.
        driver("cuMemcpyDtoDAsync (copy-engine wire)", unsafe {
            sys::cuMemcpyDtoDAsync_v2(to, from, bytes, lane.cu_stream())
        })
    }

    /// Tells replica `j` on `lane` that this replica's phase `phase` of bucket `b` has landed:
    /// writes `epoch` into the source word for (phase, b, j), then copies it into `j`'s flag for
    /// (phase, b, this replica).
    fn signal(
        &self,
        lane: &CudaStream,
        j: usize,
        phase: usize,
        b: usize,
        epoch: u32,
    ) -> Result<()> {
        let source = self.block + (self.layout.sources + 4 * word(&self.plan, phase, b, j)) as u64;
        let flag =
            self.bases[j] + (self.layout.flags + 4 * word(&self.plan, phase, b, self.rank)) as u64;
        // SAFETY: the source word lies in this replica's block; the flag in replica j's.
        driver("cuStreamWriteValue32 (copy-engine wire)", unsafe {
            sys::cuStreamWriteValue32_v2(
                lane.cu_stream(),
                source,
                epoch,
                sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        })?;
        self.copy(lane, flag, source, 4)
    }

    /// Makes `stream` wait until this replica's flag word `index` has reached `epoch`
    /// (cyclically).
    fn wait_flag(&self, stream: &CudaStream, index: usize, epoch: u32) -> Result<()> {
        let flag = self.block + (self.layout.flags + 4 * index) as u64;
        // SAFETY: the flag word lies in this replica's block.
        driver("cuStreamWaitValue32 (copy-engine wire)", unsafe {
            sys::cuStreamWaitValue32_v2(
                stream.cu_stream(),
                flag,
                epoch,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        })
    }
}

impl Drop for PeerWire {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        for lanes in self.lanes.iter().flatten() {
            let _ = lanes.scatter.synchronize();
            let _ = lanes.gather.synchronize();
        }
        // The views must not free what the block owns.
        if let Some(s) = self.staging.take() {
            s.leak();
        }
        if let Some(s) = self.inbox.take() {
            s.leak();
        }
        // SAFETY: each pointer was mapped or allocated here and is released once; failures at
        // the end of a run cannot be reported anywhere useful.
        unsafe {
            for &base in &self.opened {
                let _ = sys::cuIpcCloseMemHandle(base);
            }
            let _ = sys::cuMemFree_v2(self.block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_each_bucket_once_in_order() {
        let buckets = [0..1000, 1000..1003, 1003..1003, 1003..70_001];
        for replicas in 1..=8 {
            let plan = SlicePlan::new(&buckets, replicas);
            let mut at = 0;
            for (b, r) in buckets.iter().enumerate() {
                assert_eq!(plan.bucket_of(r), Some(b));
                let mut next = r.start;
                for j in 0..replicas {
                    let s = plan.slice(b, j);
                    assert_eq!(s.start, next, "bucket {b} slice {j} of {replicas}");
                    assert!(s.len() <= plan.slice_len[b]);
                    next = s.end;
                }
                assert_eq!(next, r.end, "bucket {b} covered by {replicas} slices");
                assert_eq!(plan.inbox_at(b), at);
                assert_eq!(plan.slice_len[b] % SLICE_ALIGN, 0);
                at += plan.slice_len[b];
            }
            assert_eq!(plan.slot_len(), at);
        }
    }

    #[test]
    fn regions_do_not_overlap_and_are_aligned() {
        let plan = SlicePlan::new(&[0..5000, 5000..5001], 3);
        let l = Layout::new(5001, &plan);
        assert!(l.inbox >= 2 * 5001);
        assert!(l.flags >= l.inbox + 3 * plan.slot_len() * 2);
        assert!(l.sources >= l.flags + 2 * 2 * 3 * 4);
        assert!(l.total >= l.sources + 2 * 2 * 3 * 4);
        for at in [l.inbox, l.flags, l.sources, l.total] {
            assert_eq!(at % REGION_ALIGN, 0);
        }
        let words: Vec<usize> = (0..2)
            .flat_map(|p| (0..2).flat_map(move |b| (0..3).map(move |s| (p, b, s))))
            .map(|(p, b, s)| word(&plan, p, b, s))
            .collect();
        assert_eq!(words, (0..12).collect::<Vec<_>>());
    }

    #[test]
    fn records_round_trip() {
        let mut handle = [0u8; 64];
        handle
            .iter_mut()
            .enumerate()
            .for_each(|(i, h)| *h = i as u8 ^ 0xA5);
        let r = Record {
            host: 0x0123_4567_89AB_CDEF,
            pid: 4242,
            ordinal: 3,
            base: 0x7F00_0000_1000,
            total: 1 << 33,
            handle,
        };
        assert_eq!(Record::from_bytes(&r.to_bytes()), r);
        assert_eq!(host_key(), host_key());
    }
}

#[cfg(test)]
mod gpu_tests {
    use super::*;
    use crate::config::MathMode;
    use crate::cuda::nccl::NcclId;
    use crate::cuda::test_util::nccl_devices_or_skip;
    use crate::dist::wire::add;
    use half::bf16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Replica `r`'s bfloat16 terms in round `round`: random magnitudes over 40 binades, and
    /// now and then a value that cancels another replica's.
    fn terms(r: usize, round: usize, len: usize) -> Vec<u16> {
        let mut rng = ChaCha8Rng::seed_from_u64((100 * round + r) as u64);
        (0..len)
            .map(|_| {
                let scale = 2f32.powi(rng.gen_range(-20..20));
                bf16::from_f32((rng.gen::<f32>() - 0.5) * scale).to_bits()
            })
            .collect()
    }

    /// Every replica of `replicas` GPUs (threads of this process, so the peers are addressed
    /// directly) sums three rounds of buckets of uneven sizes, one smaller than a slice per
    /// replica: each bucket's sum is the CPU wire's rank-order sum bit for bit, on every replica,
    /// and the elements outside the buckets keep the replica's own terms.
    fn sums_match_cpu(replicas: usize) {
        let name = format!(
            "{}::sums_match_the_cpu_wire_on_{replicas}_gpus",
            module_path!()
        );
        if !nccl_devices_or_skip(&name, replicas) {
            return;
        }
        let len = 300_001;
        let buckets = [10..200_000, 200_000..200_050, 200_100..300_001];
        let rounds = 3;
        let id = NcclId::new().unwrap();
        let results: Vec<Vec<Vec<u16>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..replicas)
                .map(|r| {
                    let buckets = &buckets;
                    s.spawn(move || {
                        let gpu = Gpu::new(r, MathMode::Fp32).unwrap();
                        let stream = gpu.ctx.new_stream().unwrap();
                        let comm = NcclComm::from_id(stream.clone(), r, replicas, id).unwrap();
                        let mut wire = PeerWire::new(&gpu, &comm, buckets, len).unwrap();
                        let mut out = Vec::new();
                        for round in 0..rounds {
                            let host = terms(r, round, len);
                            gpu.compute.memcpy_htod(&host, wire.staging_mut()).unwrap();
                            for b in buckets {
                                wire.all_reduce(&gpu.kernels, &gpu.compute, &stream, b)
                                    .unwrap();
                            }
                            let mut got = vec![0u16; len];
                            stream.memcpy_dtoh(wire.staging(), &mut got).unwrap();
                            stream.synchronize().unwrap();
                            gpu.synchronize().unwrap();
                            out.push(got);
                        }
                        comm.finish().unwrap();
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for round in 0..rounds {
            let inputs: Vec<Vec<u16>> = (0..replicas).map(|r| terms(r, round, len)).collect();
            for (r, got) in results.iter().enumerate() {
                for (i, &g) in got[round].iter().enumerate() {
                    let want = match buckets.iter().any(|b| b.contains(&i)) {
                        true => (1..replicas).fold(inputs[0][i], |acc, s| {
                            add(bf16::from_bits(acc), bf16::from_bits(inputs[s][i])).to_bits()
                        }),
                        false => inputs[r][i],
                    };
                    assert_eq!(g, want, "round {round}, replica {r}, element {i}");
                }
            }
        }
    }

    #[test]
    fn sums_match_the_cpu_wire_on_two_gpus() {
        sums_match_cpu(2);
    }

    #[test]
    fn sums_match_the_cpu_wire_on_four_gpus() {
        sums_match_cpu(4);
    }
}
