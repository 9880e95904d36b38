// ---------------------------------------------------------------------------------------------
// Per-channel reductions in two deterministic stages over a channel view (outer, dim, inner):
// chunk k of `splits` equal chunks of a channel's outer * inner values (of its outer rows when
// inner == 1) is summed by one block into `partial`, and a finishing kernel adds a channel's
// partials in chunk order. The chunking and the summation trees depend only on the shape, so the
// result is the same on every run.
//
// Grids (Kernels::grid_channel_sums): for inner > 1, blockIdx.y is the channel and blockIdx.x the
// chunk, 256 threads reading a channel's contiguous runs; for inner == 1 (channels-last), a block
// of 32 x 8 threads covers the 32 channels of tile blockIdx.y over chunk blockIdx.x of the rows,
// so that each warp reads whole 128-byte runs of adjacent channels.

#define SUM_TILE 32
#define SUM_ROWS 8

// N sums of doubles, the terms of one element or the sums of one thread.
template <int N>
struct Sums {
    double v[N];
};

// Stage 1 of N sums per channel: term(idx, d) is the Sums<N> of element idx of channel d.
// Writes partial[(d * splits + k) * N + j], j < N.
template <int N, class Term>
__device__ __forceinline__ void view_sums_n(Term term, double* partial, int outer, int dim,
                                            int inner, int splits) {
    const int k = blockIdx.x;
    Sums<N> acc;
    for (int j = 0; j < N; ++j) acc.v[j] = 0.0;
    int d;
    if (inner == 1) {
        __shared__ double rows[N][SUM_ROWS][SUM_TILE];
        d = blockIdx.y * SUM_TILE + threadIdx.x;
        const int chunk = (outer + splits - 1) / splits;
        const int begin = k * chunk;
        const int end = min(outer, begin + chunk);
        if (d < dim) {
            // Eight rows' loads in flight per thread (four for the four-sum terms, which read
            // three tensors each), added in row order as one at a time would.
            constexpr int ROWS_IN_FLIGHT = N <= 2 ? 8 : 4;
            int r = begin + threadIdx.y;
            for (; r + (ROWS_IN_FLIGHT - 1) * SUM_ROWS < end; r += ROWS_IN_FLIGHT * SUM_ROWS) {
                Sums<N> t[ROWS_IN_FLIGHT];
#pragma unroll
                for (int u = 0; u < ROWS_IN_FLIGHT; ++u)
                    t[u] = term((r + u * SUM_ROWS) * dim + d, d);
#pragma unroll
                for (int u = 0; u < ROWS_IN_FLIGHT; ++u)
                    for (int j = 0; j < N; ++j) acc.v[j] += t[u].v[j];
            }
            for (; r < end; r += SUM_ROWS) {
                const Sums<N> t = term(r * dim + d, d);
                for (int j = 0; j < N; ++j) acc.v[j] += t.v[j];
            }
        }
        for (int j = 0; j < N; ++j) rows[j][threadIdx.y][threadIdx.x] = acc.v[j];
        __syncthreads();
        if (threadIdx.y != 0 || d >= dim) return;
        for (int j = 0; j < N; ++j) {
            acc.v[j] = 0.0;
            for (int y = 0; y < SUM_ROWS; ++y) acc.v[j] += rows[j][y][threadIdx.x];
        }
    } else {
        d = blockIdx.y;
        const int per = outer * inner;
        const int chunk = (per + splits - 1) / splits;
        const int begin = k * chunk;
        const int end = min(per, begin + chunk);
        const FastDiv by_inner = fast_div(inner);
        for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
            const int o = div_by(i, by_inner);
            const Sums<N> t = term((o * dim + d) * inner + (i - o * inner), d);
            for (int j = 0; j < N; ++j) acc.v[j] += t.v[j];
        }
        for (int j = 0; j < N; ++j) acc.v[j] = block_sum(acc.v[j]);
        if (threadIdx.x != 0) return;
    }
    for (int j = 0; j < N; ++j) partial[(d * splits + k) * N + j] = acc.v[j];
}

// Stage 1 of one or two sums per channel: term(idx, d) is the (first, second) term of element
// idx of channel d. Writes partial[(d * splits + k) * 2 + {0, 1}] when pair, else only the first
// sum at partial[d * splits + k].
template <class Term>
__device__ __forceinline__ void view_sums(Term term, double* partial, int pair, int outer,
                                          int dim, int inner, int splits) {
    if (pair) {
        view_sums_n<2>(
            [=](int idx, int d) {
                const double2 t = term(idx, d);
                return Sums<2>{{t.x, t.y}};
            },
            partial, outer, dim, inner, splits);
    } else {
        view_sums_n<1>(
            [=](int idx, int d) {
                return Sums<1>{{term(idx, d).x}};
            },
            partial, outer, dim, inner, splits);
    }
}

// view_sums_n over a channels-last view (outer rows of dim channels, dim % 8 == 0) of half-type
// tensors, V (4 or 8) adjacent channels a thread: one 8- or 16-byte load a tensor a row instead
// of V 2-byte ones, and each thread's per-channel operands read once. Launched on the splits of
// Kernels::grid_channel_sums with blocks of (min(32, dim / V), SUM_ROWS) threads and
// ceil(dim / (V * blockDim.x)) tiles in y (Kernels::grid_channel_sums_by): thread (x, y) covers
// channels d0 .. d0 + V, d0 = V * (blockIdx.y * blockDim.x + x), over the rows of chunk
// blockIdx.x that view_sums_n's thread y covers, so that every channel's terms are added in
// view_sums_n's order and the partials are the same bits. load(idx0) reads a row's V elements
// idx0 .. idx0 + V of every tensor (one value), add(in, acc) adds their terms to acc[e], channel
// d0 + e, in order. `rows` is the kernel's shared CHANNELS_LAST_ROWS doubles (one array however
// many instances the kernel inlines). V = 4 keeps the four-sum kernels' accumulators to 32
// registers, so that more than one block of 256 threads fits a multiprocessor.
#define CHANNELS_LAST_ROWS (SUM_ROWS * 8 * SUM_TILE)
template <int N, int V, int ROWS_IN_FLIGHT, class Load, class Add>
__device__ __forceinline__ void channels_last_sums(Load load, Add add, double* rows,
                                                   double* partial, int outer, int dim,
                                                   int splits) {
    static_assert(V == 4 || V == 8, "four or eight channels a thread");
    const int k = blockIdx.x;
    const int d0 = V * (blockIdx.y * blockDim.x + threadIdx.x);
    Sums<N> acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e)
#pragma unroll
        for (int j = 0; j < N; ++j) acc[e].v[j] = 0.0;
    const int chunk = (outer + splits - 1) / splits;
    const int begin = k * chunk;
    const int end = min(outer, begin + chunk);
    if (d0 < dim) {
        int r = begin + threadIdx.y;
        for (; r + (ROWS_IN_FLIGHT - 1) * SUM_ROWS < end; r += ROWS_IN_FLIGHT * SUM_ROWS) {
            decltype(load(0)) in[ROWS_IN_FLIGHT];
#pragma unroll
            for (int u = 0; u < ROWS_IN_FLIGHT; ++u) in[u] = load((r + u * SUM_ROWS) * dim + d0);
#pragma unroll
            for (int u = 0; u < ROWS_IN_FLIGHT; ++u) add(in[u], acc);
        }
        for (; r < end; r += SUM_ROWS) add(load(r * dim + d0), acc);
    }
    // The rows' sums of channel d0 + e at [(y * V + e) * SUM_TILE + x], one sum index at a time.
#pragma unroll
    for (int j = 0; j < N; ++j) {
        __syncthreads();
#pragma unroll
        for (int e = 0; e < V; ++e) {
            rows[(threadIdx.y * V + e) * SUM_TILE + threadIdx.x] = acc[e].v[j];
        }
        __syncthreads();
        if (threadIdx.y != 0 || d0 >= dim) continue;
#pragma unroll
        for (int e = 0; e < V; ++e) {
            double sum = 0.0;
            for (int y = 0; y < SUM_ROWS; ++y) sum += rows[(y * V + e) * SUM_TILE + threadIdx.x];
            partial[((d0 + e) * splits + k) * N + j] = sum;
        }
    }
}

// partial[d * splits + k] = sum over chunk k of channel d of a * (has_b ? b : 1);
// a is rounded to the half type `half` as it is read (round_if_half), as bn_sums rounds it, whose
// parameter list this kernel shares. a and b stored as T (float, or half-type bit patterns for
// channel_reduce_h: load_value).
template <class T>
__device__ __forceinline__ void channel_reduce_of(const T* a, const T* b, int has_b,
                                                  double* partial, int outer, int dim, int inner,
                                                  int splits, int half) {
    view_sums(
        [=](int idx, int) {
            const double v = (double)round_if_half(load_value(a, idx, half), half);
            return make_double2(has_b ? v * (double)load_value(b, idx, half) : v, 0.0);
        },
        partial, 0, outer, dim, inner, splits);
}

extern "C" __global__ void channel_reduce(const float* a, const float* b, int has_b,
                                          double* partial, int outer, int dim, int inner,
                                          int splits, int half) {
    channel_reduce_of(a, b, has_b, partial, outer, dim, inner, splits, half);
}

// channel_reduce of half-type a and b (a convolution's bias gradient from its half-type top
// gradient): every value exact, so the same partials as channel_reduce of their FP32 values.
extern "C" __global__ void channel_reduce_h(const unsigned short* a, const unsigned short* b,
                                            int has_b, double* partial, int outer, int dim,
                                            int inner, int splits, int half) {
    WITH_HALF_CONSTANT(channel_reduce_of(a, b, has_b, partial, outer, dim, inner, splits, half));
}

// out[d] (+)= sum over k of partial[d * splits + k] (chunk_sums' order).
extern "C" __global__ void channel_reduce_finish(const double* partial, float* out, int dim,
                                                 int splits, int accumulate) {
    WARP_PER_CHANNEL(d, dim) {
        double s, unused;
        chunk_sums(partial, d, splits, 1, &s, &unused);
        if ((threadIdx.x & 31) == 0) out[d] = accumulate ? out[d] + (float)s : (float)s;
    }
}

// From bn_sums' partials of (a, b) over a channel view: out[d] (+)= sum a*b and
// out[dim + d] (+)= sum a, each over its chunks (a Scale layer's [scale, bias] gradient in one
// pass over dy and x).
extern "C" __global__ void pair_reduce_finish(const double* partial, float* out, int dim,
                                              int splits, int accumulate) {
    WARP_PER_CHANNEL(d, dim) {
        double sa, sab;
        chunk_sums(partial, d, splits, 2, &sa, &sab);
        if ((threadIdx.x & 31) != 0) continue;
        out[d] = accumulate ? out[d] + (float)sab : (float)sab;
        out[dim + d] = accumulate ? out[dim + d] + (float)sa : (float)sa;
    }
}

// y = x * s[d] (+ b[d]) over the view (n / (dim * inner), dim, inner); has_s/has_b select.
extern "C" __global__ void channel_affine(const float* x, const float* s, int has_s,
                                          const float* b, int has_b, float* y, int n, int dim,
                                          int inner) {
    const FastDiv by_inner = fast_div(inner), by_dim = fast_div(dim);
    GRID_STRIDE_INT(i, n) {
        const int d = channel_of(i, by_inner, by_dim);
        float v = x[i];
        if (has_s) v = v * s[d];
        if (has_b) v = v + b[d];
        y[i] = v;
    }
}

// dx (+)= dy * s[d]
extern "C" __global__ void channel_scale_backward(const float* dy, const float* s, float* dx,
                                                  int n, int dim, int inner, int accumulate) {
    const FastDiv by_inner = fast_div(inner), by_dim = fast_div(dim);
    GRID_STRIDE_INT(i, n) {
        const float g = dy[i] * s[channel_of(i, by_inner, by_dim)];
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

// ---------------------------------------------------------------------------------------------
// PReLU over the view (n / (dim * inner), dim, inner): one slope per channel d (dim = 1: one
// slope for all).

// y = max(x, 0) + s[d] * min(x, 0)
extern "C" __global__ void prelu_forward(const float* x, const float* s, float* y, int n, int dim,
                                         int inner) {
    const FastDiv by_inner = fast_div(inner), by_dim = fast_div(dim);
    GRID_STRIDE_INT(i, n) {
        const float v = x[i];
        y[i] = fmaxf(v, 0.0f) + s[channel_of(i, by_inner, by_dim)] * fminf(v, 0.0f);
    }
}

// dx (+)= x > 0 ? dy : s[d] * dy
extern "C" __global__ void prelu_backward(const float* x, const float* dy, const float* s,
                                          float* dx, int n, int dim, int inner, int accumulate) {
    const FastDiv by_inner = fast_div(inner), by_dim = fast_div(dim);
    GRID_STRIDE_INT(i, n) {
        const float g = x[i] > 0.0f ? dy[i] : s[channel_of(i, by_inner, by_dim)] * dy[i];
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

// m = x <= 0 ? x : 0, the factor of dy in a slope's gradient (summed by channel_reduce).
extern "C" __global__ void prelu_negative_part(const float* x, float* m, int n) {
    GRID_STRIDE_INT(i, n) m[i] = x[i] <= 0.0f ? x[i] : 0.0f;
}
