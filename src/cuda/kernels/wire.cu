// ---------------------------------------------------------------------------------------------
// The bfloat16 gradient wire (cluster.reduce_dtype = "bf16"): FP32 gradients to bfloat16 bits
// before NCCL's bfloat16 sum, and the sum back to FP32 times the averaging scale after it. The
// rounding is written with integer operations so that it is the CPU reference's
// (p2ptrain::dist::wire, the `half` crate's f32 -> bf16) bit for bit, NaN payloads included;
// CUDA's __float2bfloat16_rn would turn every NaN into one canonical NaN.

// The bfloat16 bits of x: round to nearest, ties to even; a NaN keeps its sign and upper payload
// and gets the quiet bit.
__device__ __forceinline__ unsigned short float_to_bf16_bits(float x) {
    const unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
    const unsigned int round_bit = 0x00008000u;
    const unsigned int up = (u & round_bit) != 0 && (u & (3u * round_bit - 1u)) != 0;
    return (unsigned short)((u >> 16) + up);
}

// w[i] = bf16(x[i]) for i < n.
extern "C" __global__ void to_bf16(const float* x, unsigned short* w, long long n) {
    GRID_STRIDE_LONG(i, n) w[i] = float_to_bf16_bits(x[i]);
}

// x[i] = float(w[i]) * scale for i < n: the widening is exact, the product rounds once.
extern "C" __global__ void from_bf16_scaled(const unsigned short* w, float* x, float scale,
                                            long long n) {
    GRID_STRIDE_LONG(i, n) x[i] = __uint_as_float((unsigned int)w[i] << 16) * scale;
}

// The copy-engine wire's sum of one bucket slice (p2ptrain::cuda::peer_wire): own[i] becomes the
// bfloat16 sum over the replicas in rank order, each addition rounded once (as
// p2ptrain::dist::wire::add). Replica `rank`'s own term is own[i]; replica s's (s != rank) is
// slots[s * stride + i], the slice its peer copy delivered.
extern "C" __global__ void sum_bf16_slices(const unsigned short* slots, long long stride,
                                           unsigned short* own, int rank, int replicas,
                                           long long n) {
    GRID_STRIDE_LONG(i, n) {
        unsigned short acc = rank == 0 ? own[i] : slots[i];
        for (int s = 1; s < replicas; ++s) {
            const unsigned short v = s == rank ? own[i] : slots[s * stride + i];
            const float sum = __uint_as_float((unsigned int)acc << 16)
                            + __uint_as_float((unsigned int)v << 16);
            acc = float_to_bf16_bits(sum);
        }
        own[i] = acc;
    }
}
