// What every kernel of p2ptrain's GPU backend shares: its conventions, grid-stride loops, warp and
// block reductions, fast division and the channel helpers, and the stream-holding kernel of the
// path timings. The sources of src/cuda/kernels/ are compiled at run time by NVRTC as one program,
// this file first (src/cuda/kernels.rs embeds them in order), each family's source beside the
// Rust file of the same name that launches its kernels. Every kernel is `extern "C"` so that the
// host loads it by its plain name.
//
// Conventions:
// - Grid-stride loops: any grid size is correct; the host picks one wave of resident blocks.
// - Activation kernels index with `int` (the host checks counts below 2^31); kernels over the
//   flat parameter buffers index with `long long`.
// - Backward kernels take `accumulate`: 1 adds into the bottom diff (the layer contract), 0
//   overwrites it (the net passes 0 only where this layer is the blob's single gradient
//   contributor, which equals zero-filling then adding).
// - Arithmetic mirrors the CPU code operation for operation, and the program is compiled with
//   --fmad=false, so the update rules and most layer outputs are bit-identical to the CPU
//   reference (exp, log and tanh differ in the last bits; sums differ in order).
// - Reductions are deterministic: fixed block shapes and fixed summation trees, no atomics.

#define FULL_MASK 0xffffffffu
// f32::MIN_POSITIVE, the smallest normal float: the CPU clamps probabilities to it.
#define F32_MIN_POSITIVE 1.17549435e-38f

#define GRID_STRIDE_INT(i, n)                                                                     \
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += gridDim.x * blockDim.x)

#define GRID_STRIDE_LONG(i, n)                                                                    \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n);                 \
         i += (long long)gridDim.x * blockDim.x)

// The grid-stride loop of the memory-bound elementwise kernels, K of a thread's elements at a
// time: load(i) reads element i's inputs (the values it streams, returned as one value), apply(i,
// v) computes and writes element i from them. The K loads are issued before any element is
// applied, so that K times as many reads are in flight; each element is computed as it would
// be alone, so the results are those of the plain loop, and an in-place kernel (an output that is
// one of its inputs) reads every element before writing it.
template <int K, class Load, class Apply>
__device__ __forceinline__ void grid_stride_by(int n, Load load, Apply apply) {
    const int stride = gridDim.x * blockDim.x;
    // 64 bits for the position, which may pass 2^31 on its last step; each index fits an int.
    long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (; j + (K - 1LL) * stride < n; j += (long long)K * stride) {
        const int i = (int)j;
        decltype(load(0)) v[K];
#pragma unroll
        for (int u = 0; u < K; ++u) v[u] = load(i + u * stride);
#pragma unroll
        for (int u = 0; u < K; ++u) apply(i + u * stride, v[u]);
    }
    for (; j < n; j += stride) apply((int)j, load((int)j));
}

// grid_stride_by with four elements at a time.
template <class Load, class Apply>
__device__ __forceinline__ void grid_stride_by_four(int n, Load load, Apply apply) {
    grid_stride_by<4>(n, load, apply);
}

__device__ __forceinline__ float neg_infinity() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024), valid in thread 0.
// Safe to call several times in one kernel.
__device__ double block_sum(double v) {
    __shared__ double partial[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    }
    return v;
}

// ---------------------------------------------------------------------------------------------
// Keeps its stream busy for `ns` nanoseconds of the device's global timer (one thread): queued
// ahead of work to be timed, so that the host has enqueued all of that work before the device
// starts it, and the time is the device's alone (see src/cuda/path_timing.rs).
extern "C" __global__ void hold_stream(long long ns) {
    long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
#if __CUDA_ARCH__ >= 700
        __nanosleep(1000);  // (older devices spin)
#endif
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

// ---------------------------------------------------------------------------------------------
// The helpers of the convolutional-net layers' kernels. A 4-D blob is
// stored NCHW or channels-last (NHWC); a "channel view" of a blob is (outer, dim, inner) with the
// channel index (i / inner) % dim: (N, C, H * W) for NCHW, (N * H * W, C, 1) for NHWC, so the
// channel kernels serve both layouts. Channel indices are computed with FastDiv (a multiply-high
// and a shift instead of the ~20 instructions of an integer division, which would otherwise bound
// these memory-bound kernels).

// Division of non-negative ints below 2^31 by a fixed positive divisor d: q = (hi(n * m) + n) >> s
// with s = ceil(log2 d) and m = floor(2^32 * (2^s - d) / d) + 1 (Granlund and Montgomery). Each
// thread builds its divisors once; the grid-stride loops amortise that over many elements.
struct FastDiv {
    unsigned d, m, s;
};

__device__ __forceinline__ FastDiv fast_div(int d) {
    FastDiv f;
    f.d = (unsigned)d;
    f.s = 0;
    while ((1u << f.s) < f.d) ++f.s;
    f.m = (unsigned)(((1ull << 32) * ((1ull << f.s) - f.d)) / f.d + 1);
    return f;
}

__device__ __forceinline__ int div_by(int n, FastDiv f) {
    const unsigned t = __umulhi((unsigned)n, f.m);
    return (int)((t + (unsigned)n) >> f.s);
}

// (i / inner) % dim
__device__ __forceinline__ int channel_of(int i, FastDiv inner, FastDiv dim) {
    const int q = div_by(i, inner);
    return q - div_by(q, dim) * (int)dim.d;
}

// The finishing kernels of the per-channel reductions run one warp per channel: `ch` runs over
// this warp's channels (launched with Kernels::grid_rows).
#define WARP_PER_CHANNEL(ch, c)                                                                   \
    for (int ch = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; ch < (c);                         \
         ch += (gridDim.x * blockDim.x) >> 5)

__device__ __forceinline__ double warp_sum_double(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// The sums over the `splits` chunks of channel ch of the stage-1 partials laid out
// [(ch * splits + k) * stride + at + j], j < pair (1 or 2): lane l adds chunks l, l + 32, ... in
// order, then a fixed shuffle tree adds the lanes, so the result depends only on the shape.
// Called by a whole warp; valid in every lane.
__device__ __forceinline__ void chunk_sums_at(const double* partial, int ch, int splits,
                                              int stride, int at, int pair, double* s1,
                                              double* s2) {
    const int lane = threadIdx.x & 31;
    double a = 0.0, b = 0.0;
    for (int k = lane; k < splits; k += 32) {
        a += partial[(ch * splits + k) * stride + at];
        if (pair == 2) b += partial[(ch * splits + k) * stride + at + 1];
    }
    *s1 = warp_sum_double(a);
    *s2 = warp_sum_double(b);
}

// chunk_sums_at of partials laid out [(ch * splits + k) * pair + j], j < pair.
__device__ __forceinline__ void chunk_sums(const double* partial, int ch, int splits, int pair,
                                           double* s1, double* s2) {
    chunk_sums_at(partial, ch, splits, pair, 0, pair, s1, s2);
}
