//! The gradient wire of one GPU replica (`cluster.reduce_dtype`): how a bucket of the flat FP32
//! gradient is averaged over a communicator. FP32: NCCL's in-place `Avg`. bfloat16: a kernel
//! rounds the bucket into a staging buffer of bfloat16 bits (`to_bf16`, [`GradientWire::pack`]),
//! NCCL sums those in bfloat16 (`ncclBfloat16`, half the bytes; [`GradientWire::reduce`]), and
//! the sum comes back as FP32 times `1/R` (`from_bf16_scaled`) — the arithmetic of
//! `crate::dist::wire`, which the CPU backend runs.
//!
//! The staging buffer is as long as the gradient and holds each bucket at the bucket's own
//! offsets, so buckets never wait for one another's staging. The engine packs a bucket on a
//! rounding stream of its own as the backward that completes it ends, and the communication
//! stream runs only the sum's part of the trips; the sum is written back over the bucket on the
//! communication stream ([`GradientWire::unpack`]), or left in the staging buffer for an update
//! that reads it there ([`GradientWire::sum`]: the widening and the `1/R` in the same FP32
//! operations).
//!
//! The bfloat16 sum crosses between GPUs by NCCL's all-reduce, or, with
//! `cluster.reduce_transport = "copy_engines"`, by the copy engines' peer copies and one summing
//! kernel (`super::peer_wire`, whose block then holds the staging buffer).

use super::kernels::{Kernels, WireSum};
use super::nccl::{NcclComm, ReduceOp};
use super::peer_wire::PeerWire;
use super::{gpu_error, Gpu};
use crate::config::{ReduceDtype, ReduceTransport};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaStream};
use std::ops::Range;

/// A replica's wire: its element type and, for bfloat16, where its staging buffer lives.
pub struct GradientWire {
    dtype: ReduceDtype,
    staging: Staging,
}

/// The bfloat16 wire's staging buffer: `(gradient floats)` bfloat16 bit patterns at the
/// gradient's offsets.
enum Staging {
    /// The FP32 wire: none.
    None,
    /// A buffer of its own, for NCCL's sum.
    Own(CudaSlice<u16>),
    /// The copy engines' wire (`reduce_transport = "copy_engines"`), whose block holds it.
    Peers(Box<PeerWire>),
}

impl GradientWire {
    /// The wire of `dtype` for a gradient of `len` floats, its staging buffer (if any)
    /// allocated on `gpu`'s compute stream.
    pub fn new(gpu: &Gpu, dtype: ReduceDtype, len: usize) -> Result<Self> {
        let staging = match dtype {
            ReduceDtype::Fp32 => Staging::None,
            ReduceDtype::Bf16 => Staging::Own(
                gpu.compute
                    .alloc_zeros::<u16>(len.max(1))
                    .map_err(|e| gpu_error("allocate the bfloat16 gradient staging buffer", e))?,
            ),
        };
        Ok(GradientWire { dtype, staging })
    }

    /// The wire of `dtype` over `transport` for the buckets `buckets` of a `len`-float gradient,
    /// summed over `comm`'s replicas. The copy engines' wire is set up with every replica (a
    /// collective) where the wire is bfloat16 and has peers; otherwise as [`Self::new`].
    pub fn over(
        gpu: &Gpu,
        dtype: ReduceDtype,
        transport: ReduceTransport,
        comm: &NcclComm,
        buckets: &[Range<usize>],
        len: usize,
    ) -> Result<Self> {
        let by_copy_engines = transport == ReduceTransport::CopyEngines
            && dtype == ReduceDtype::Bf16
            && comm.size() > 1;
        if !by_copy_engines {
            return Self::new(gpu, dtype, len);
        }
        Ok(GradientWire {
            dtype,
            staging: Staging::Peers(Box::new(PeerWire::new(gpu, comm, buckets, len)?)),
        })
    }

    /// Whether buckets are rounded into a staging buffer before they travel (the bfloat16 wire).
    pub fn packs(&self) -> bool {
        self.dtype == ReduceDtype::Bf16
    }

    /// Bytes `floats` gradient elements take on the wire.
    pub fn bytes(&self, floats: usize) -> u64 {
        (floats * self.dtype.bytes()) as u64
    }

    /// The staging buffer, checked to hold `range` of a `len`-float gradient.
    fn staging_for(
        &mut self,
        range: &Range<usize>,
        len: usize,
    ) -> Result<Option<&mut CudaSlice<u16>>> {
        let staging = match &mut self.staging {
            Staging::None => return Ok(None),
            Staging::Own(staging) => staging,
            Staging::Peers(peers) => peers.staging_mut(),
        };
        if range.end > staging.len() || range.end > len || range.start > range.end {
            return Err(Error::Device(format!(
                "bfloat16 gradient wire: bucket {}..{} of a {len}-float gradient does not fit the \
                 {}-element staging buffer",
                range.start,
                range.end,
                staging.len()
            )));
        }
        Ok(Some(staging))
    }

    /// Rounds `grad[range]` into the staging buffer on `stream` (nothing on the FP32 wire).
    pub fn pack(
        &mut self,
        kernels: &Kernels,
        stream: &CudaStream,
        grad: &CudaSlice<f32>,
        range: Range<usize>,
    ) -> Result<()> {
        let Some(staging) = self.staging_for(&range, grad.len())? else {
            return Ok(());
        };
        let n = range.len();
        kernels.to_bf16(
            stream,
            &grad.slice(range.clone()),
            &mut staging.slice_mut(range),
            n,
        )
    }

    /// The all-reduce of the bucket `range` on `comm`'s stream, ordered by the caller after its
    /// [`GradientWire::pack`] on `packed_on`: the FP32 average in `grad[range]`, or the bfloat16
    /// sum in the staging buffer. The copy engines carry it where they were set up for `comm`'s
    /// replicas (with `comm` the replicas' one communicator, or one of the same size: the same
    /// replicas).
    pub fn reduce(
        &mut self,
        kernels: &Kernels,
        packed_on: &CudaStream,
        comm: &NcclComm,
        grad: &mut CudaSlice<f32>,
        range: Range<usize>,
    ) -> Result<()> {
        let s = comm.stream();
        if let Staging::Peers(peers) = &mut self.staging {
            // (It refuses a range that is not one of its buckets.)
            if peers.replicas() == comm.size() {
                return peers.all_reduce(kernels, packed_on, s, &range);
            }
        }
        match self.staging_for(&range, grad.len())? {
            None => comm.all_reduce_avg(grad, range, s),
            Some(staging) => comm.all_reduce_bf16(staging, range, ReduceOp::Sum, s),
        }
    }

    /// Writes the bfloat16 sum of the bucket `range` over `grad[range]` as FP32 times `1/R` for
    /// `R` = `comm`'s replicas, on `comm`'s stream (nothing on the FP32 wire).
    pub fn unpack(
        &mut self,
        kernels: &Kernels,
        comm: &NcclComm,
        grad: &mut CudaSlice<f32>,
        range: Range<usize>,
    ) -> Result<()> {
        let scale = averaging(comm);
        let Some(staging) = self.staging_for(&range, grad.len())? else {
            return Ok(());
        };
        let n = range.len();
        let sum = staging.slice(range.clone());
        kernels.from_bf16_scaled(comm.stream(), &sum, &mut grad.slice_mut(range), scale, n)
    }

    /// The bfloat16 sums left in the staging buffer, averaged over `comm`'s replicas as they are
    /// read; `None` on the FP32 wire, whose average is in the gradient buffer.
    pub fn sum(&self, comm: &NcclComm) -> Option<WireSum<'_>> {
        let staging = match &self.staging {
            Staging::None => None,
            Staging::Own(staging) => Some(staging),
            Staging::Peers(peers) => Some(peers.staging()),
        };
        staging.map(|bits| WireSum {
            bits,
            scale: averaging(comm),
        })
    }
}

/// The factor that turns a sum over `comm`'s replicas into their mean: `1/R` in FP32.
fn averaging(comm: &NcclComm) -> f32 {
    1.0 / comm.size() as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MathMode;
    use crate::cuda::nccl::NcclId;
    use crate::cuda::test_util::{gpu_or_skip, nccl_devices_or_skip};
    use crate::dist::wire::{add, from_wire_scaled, to_wire};
    use half::bf16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Replaces `grad[range]` by its mean over `comm`'s replicas through `wire`: packed, reduced
    /// and unpacked, all on `comm`'s stream.
    fn all_reduce_avg(
        wire: &mut GradientWire,
        kernels: &Kernels,
        comm: &NcclComm,
        grad: &mut CudaSlice<f32>,
        range: Range<usize>,
    ) -> Result<()> {
        wire.pack(kernels, comm.stream(), grad, range.clone())?;
        wire.reduce(kernels, comm.stream(), comm, grad, range.clone())?;
        wire.unpack(kernels, comm, grad, range)
    }

    /// FP32 inputs that reach every branch of the rounding: ties (even and odd), just below and
    /// above them, zeros, subnormals, the largest finite (which rounds to ∞), infinities and
    /// NaNs with payloads; then random bit patterns and random ties.
    fn rounding_cases() -> Vec<f32> {
        let mut bits: Vec<u32> = vec![
            0x0000_0000,
            0x8000_0000,
            0x3F80_8000,
            0x3F81_8000,
            0x3F80_7FFF,
            0x3F80_8001,
            0x0000_8000,
            0x0001_8000,
            0x0000_8001,
            0x807F_FFFF,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            0x7F7F_8000,
            0x7F80_0000,
            0xFF80_0000,
            0x7F80_0001,
            0xFFC0_1234,
            0x7FFF_FFFF,
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(16);
        bits.extend((0..1 << 16).map(|_| rng.gen::<u32>()));
        bits.extend((0..1 << 12).map(|_| rng.gen::<u32>() & 0xFFFF_0000 | 0x8000));
        bits.into_iter().map(f32::from_bits).collect()
    }

    /// Bitwise equality, except that any NaN equals any NaN (a GPU's arithmetic returns its
    /// canonical NaN where the CPU keeps the payload).
    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn conversion_kernels_match_the_cpu_wire_bit_for_bit() {
        let gpu = gpu_or_skip!("conversion_kernels_match_the_cpu_wire_bit_for_bit");
        let (s, k) = (&gpu.compute, &gpu.kernels);
        let x = rounding_cases();
        let n = x.len();
        let dx = s.clone_htod(&x).unwrap();
        let mut w = s.alloc_zeros::<u16>(n).unwrap();
        k.to_bf16(s, &dx, &mut w, n).unwrap();
        let got = s.clone_dtoh(&w).unwrap();
        for (i, (&v, &g)) in x.iter().zip(&got).enumerate() {
            let want = to_wire(v).to_bits();
            assert_eq!(g, want, "element {i}: bf16({v:e} = {:#010x})", v.to_bits());
        }
        // Back: every bfloat16 pattern, times 1 (exact) and 1/3 (one rounding).
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let dw = s.clone_htod(&all).unwrap();
        let mut back = s.alloc_zeros::<f32>(all.len()).unwrap();
        for scale in [1.0f32, 1.0 / 3.0] {
            k.from_bf16_scaled(s, &dw, &mut back, scale, all.len())
                .unwrap();
            let got = s.clone_dtoh(&back).unwrap();
            for (&b, &g) in all.iter().zip(&got) {
                let want = from_wire_scaled(bf16::from_bits(b), scale);
                assert!(
                    same(g, want),
                    "{b:#06x} × {scale}: got {g:e}, want {want:e}"
                );
            }
        }
    }

    /// One replica: the bucket makes the round trip through the staging buffer and NCCL (a sum
    /// over one) and comes back rounded to bfloat16; the floats around it are untouched.
    #[test]
    fn one_replica_rounds_only_its_bucket() {
        let name = concat!(module_path!(), "::one_replica_rounds_only_its_bucket");
        if !nccl_devices_or_skip(name, 1) {
            return;
        }
        let gpu = Gpu::new(0, MathMode::Fp32).unwrap();
        let stream = gpu.ctx.new_stream().unwrap();
        let comm = NcclComm::from_id(stream.clone(), 0, 1, NcclId::new().unwrap()).unwrap();
        let host = rounding_cases();
        let mut grad = gpu.compute.clone_htod(&host).unwrap();
        gpu.synchronize().unwrap();
        let range = 7..host.len() - 5;
        let mut wire = GradientWire::new(&gpu, ReduceDtype::Bf16, range.end).unwrap();
        assert_eq!(wire.bytes(10), 20);
        all_reduce_avg(&mut wire, &gpu.kernels, &comm, &mut grad, range.clone()).unwrap();
        let too_long = all_reduce_avg(&mut wire, &gpu.kernels, &comm, &mut grad, 0..host.len());
        assert!(too_long.is_err(), "a bucket beyond the staging buffer");
        let got = stream.clone_dtoh(&grad).unwrap();
        stream.synchronize().unwrap();
        for (i, (&g, &x)) in got.iter().zip(&host).enumerate() {
            let want = match range.contains(&i) {
                true => from_wire_scaled(to_wire(x), 1.0),
                false => x,
            };
            assert!(same(g, want), "element {i}: {x:e} → {g:e}, want {want:e}");
        }
        comm.finish().unwrap();
    }

    /// Two replicas on two GPUs: NCCL's bfloat16 sum is one rounding of the exact sum, so the
    /// averaged bucket is the CPU wire's (`dist::wire`: round, add, × 1/2) bit for bit — what
    /// makes the CPU backend's two-replica bf16 runs the GPU's.
    #[test]
    fn two_replicas_average_as_the_cpu_wire_does() {
        let name = concat!(
            module_path!(),
            "::two_replicas_average_as_the_cpu_wire_does"
        );
        if !nccl_devices_or_skip(name, 2) {
            return;
        }
        let inputs: Vec<Vec<f32>> = (0..2u64)
            .map(|r| {
                let mut rng = ChaCha8Rng::seed_from_u64(40 + r);
                (0..50_000)
                    .map(|_| {
                        let scale = 2f32.powi(rng.gen_range(-20..20));
                        (rng.gen::<f32>() - 0.5) * scale
                    })
                    .collect()
            })
            .collect();
        let range = 1000..41_000;
        let id = NcclId::new().unwrap();
        let results: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2usize)
                .map(|r| {
                    let (host, range) = (&inputs[r], range.clone());
                    s.spawn(move || {
                        let gpu = Gpu::new(r, MathMode::Fp32).unwrap();
                        let stream = gpu.ctx.new_stream().unwrap();
                        let comm = NcclComm::from_id(stream.clone(), r, 2, id).unwrap();
                        let mut grad = gpu.compute.clone_htod(host).unwrap();
                        gpu.synchronize().unwrap();
                        let mut wire =
                            GradientWire::new(&gpu, ReduceDtype::Bf16, host.len()).unwrap();
                        all_reduce_avg(&mut wire, &gpu.kernels, &comm, &mut grad, range).unwrap();
                        let out = stream.clone_dtoh(&grad).unwrap();
                        stream.synchronize().unwrap();
                        comm.finish().unwrap();
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, got) in results.iter().enumerate() {
            for (i, &g) in got.iter().enumerate() {
                let want = match range.contains(&i) {
                    true => {
                        let sum = add(to_wire(inputs[0][i]), to_wire(inputs[1][i]));
                        from_wire_scaled(sum, 0.5)
                    }
                    false => inputs[r][i],
                };
                assert_eq!(g.to_bits(), want.to_bits(), "replica {r}, element {i}");
            }
        }
    }
}
