// ---------------------------------------------------------------------------------------------
// A convolution's forward computed directly, for an ungrouped NCHW convolution — a net's first
// convolution (few input channels on a wide image, where cuDNN's GEMM-like kernels keep most of
// the device waiting on their short K = C·kh·kw loop) and middle ones that timed faster than
// cuDNN's exact algorithms:
// y[n, k, oy, ox] = Σ_(c,i,j) w[k, c, i, j] · x[n, c, oy·sh − ph + i·dh, ox·sw − pw + j·dw]
// (+ bias[k] where `has_bias`) (+ y[n, k, oy, ox] where `accumulate`).
// The filters come arranged as `wt` (rows (c, i, j), columns k): the weight (K, C·kh·kw)
// transposed. With `flip`, `wt` is (C, kh·kw, K) instead — each (K, kh·kw) block of a weight
// (C, K, kh, kw) transposed — and row (c, i, j) is read as (c, kh−1−i, kw−1−j): the filters of a
// convolution's data gradient, computed as the forward of the top's gradient.
// A block (DF_THREADS threads) owns DF_K output channels, `lane_cols` (32, 16 or 8) output
// columns and, with L = 32 / lane_cols rows of lanes per warp, either
// (`d.samples` = 1) one sample and DF_ROWS · L output rows, or (`d.samples` = L, for planes too
// short for L rows of lanes) L samples and DF_ROWS output rows of each. For each chunk of
// `c_chunk` input channels it stages that chunk's filters ((c, i, j) × DF_K, so that a warp reads
// its DF_KW weights of one (c, i, j) as two broadcast float4 loads) and the input rows and
// columns its outputs see (`in_rows` × `in_cols` per channel, rows `pitch` ≥ `in_cols` apart,
// 0 in the padding; with L samples, each sample's channels `sample_pitch` floats after the
// previous sample's). Warp v computes channels k0 + DF_KW·v.., lane l = (r, col) with r =
// l / lane_cols column ox0 + col; with one sample, of the rows oy0 + 4·L·h + 4·r + t, h < 2,
// t < 4 (runs of 4 rows, so that the lanes' rows are 4 · pitch apart in shared memory: the host
// picks the pitch at which their reads meet the fewest bank conflicts); with L, of sample
// n0 + r and rows oy0 + 4·h + t (the host picks `sample_pitch` against bank conflicts the same
// way): DF_ROWS × DF_KW sums over (c, i, j) in ascending order by fused multiply-adds, then
// + bias, then + the old value — a fixed FP32 order whatever the launch.
// With `d.splits` > 1 (a grid too small to keep the device busy), the input channels are split
// into that many ranges of `d.split_channels` (whole chunks), block split s sums range s alone
// and writes its sums, without bias or old value, to `y` + s · N·K·OH·OW (scratch), and
// direct_sum_splits adds the ranges' sums in order into the output: still a fixed order, which
// depends on the shape alone. Grid: (⌈N / d.samples⌉ · ⌈K / DF_K⌉ · d.splits, row tiles,
// ⌈OW / lane_cols⌉); dynamic shared memory c_chunk · kh·kw · DF_K + (d.samples − 1) ·
// sample_pitch + c_chunk · in_rows · pitch floats.
#define DF_K 32
#define DF_KW 8
#define DF_ROWS 8
static_assert(DF_ROWS == 8, "conv_forward_direct's rows are two runs of 4");
#define DF_THREADS (32 * DF_K / DF_KW)

// How conv_forward_direct covers a convolution (the host's DirectShape).
struct DirectShape {
    int k_total, c_chunk, lane_cols, in_rows, in_cols, pitch, samples, sample_pitch, splits,
        split_channels;
};

// The row of conv_forward_direct's `wt` that holds the filters of staged row `row` = (c, tap):
// the same, or with `flip` (c, taps − 1 − tap).
__device__ __forceinline__ int direct_filter_row(int row, int flip, FastDiv by_taps) {
    if (!flip) return row;
    const int tap = row - div_by(row, by_taps) * (int)by_taps.d;
    return row + (int)by_taps.d - 1 - 2 * tap;
}

// conv_forward_direct's products of KW taps of one filter row: acc[t][q] += w[j][q] · in_row[row
// t + j · dw] for j < KW in order, the 8 weights of tap j at w_row + j · DF_K, row t of the thread
// (t % 4) · row_step + (t / 4) · run_step floats from in_row.
template <int KW>
__device__ __forceinline__ void direct_taps(const float* in_row, const float* w_row, int dw,
                                            int row_step, int run_step,
                                            float (&acc)[DF_ROWS][DF_KW]) {
#pragma unroll
    for (int j = 0; j < KW; ++j) {
        const float4 wa = *reinterpret_cast<const float4*>(w_row + j * DF_K);
        const float4 wb = *reinterpret_cast<const float4*>(w_row + j * DF_K + 4);
        const float wv[DF_KW] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int t = 0; t < DF_ROWS; ++t) {
            const float v = in_row[(t % 4) * row_step + (t / 4) * run_step + j * dw];
#pragma unroll
            for (int q = 0; q < DF_KW; ++q) acc[t][q] = fmaf(wv[q], v, acc[t][q]);
        }
    }
}

extern "C" __global__ void conv_forward_direct(const float* x, const float* wt, const float* bias,
                                               int has_bias, int flip, int accumulate, float* y,
                                               ConvGeom g, DirectShape d) {
    extern __shared__ __align__(16) float direct_smem[];
    const int taps = g.kh * g.kw, plane = d.in_rows * d.pitch;
    const int k_total = d.k_total;
    float* s_w = direct_smem;                            // (c_chunk · taps, DF_K)
    float* s_in = direct_smem + d.c_chunk * taps * DF_K;  // (samples, c_chunk, in_rows, pitch)
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int lane_rows = 32 / d.lane_cols;
    const int lane_row = lane / d.lane_cols, lane_col = lane - lane_row * d.lane_cols;
    const int k_tiles = (k_total + DF_K - 1) / DF_K;
    const int tile = blockIdx.x / d.splits, split = blockIdx.x - tile * d.splits;
    const int n_tile = tile / k_tiles, k0 = (tile - n_tile * k_tiles) * DF_K;
    const int c_begin = split * d.split_channels, c_end = min(g.c, c_begin + d.split_channels);
    const bool by_sample = d.samples > 1;
    // Rows a thread's second run of 4 starts after its first; its row of lanes' first row and
    // sample.
    const int run_rows = by_sample ? 4 : 4 * lane_rows;
    const int lane_oy = by_sample ? 0 : 4 * lane_row;
    const int n0 = n_tile * d.samples, n_lane = n0 + (by_sample ? lane_row : 0);
    const int oy0 = blockIdx.y * 2 * run_rows, ox0 = blockIdx.z * d.lane_cols;
    const int y_base = oy0 * g.sh - g.ph, x_base = ox0 * g.sw - g.pw;
    const long long sample_values = (long long)g.c * g.h * g.w;
    const int channel_values = d.in_rows * d.in_cols;
    const FastDiv by_taps = fast_div(taps), by_channel = fast_div(channel_values),
                  by_cols = fast_div(d.in_cols);
    float acc[DF_ROWS][DF_KW];
#pragma unroll
    for (int t = 0; t < DF_ROWS; ++t) {
#pragma unroll
        for (int q = 0; q < DF_KW; ++q) acc[t][q] = 0.0f;
    }
    // Shared-memory offsets of a thread's rows: t % 4 rows apart, then a run on.
    const int kq = warp * DF_KW, row_step = g.sh * d.pitch, run_step = run_rows * row_step;
    const int lane_offset =
        (by_sample ? lane_row * d.sample_pitch : lane_oy * row_step) + lane_col * g.sw;
    for (int c0 = c_begin; c0 < c_end; c0 += d.c_chunk) {
        const int chunk = min(d.c_chunk, c_end - c0);
        if (c0 > c_begin) __syncthreads();  // the previous chunk's reads are done
        // Filters: consecutive threads read consecutive output channels of one row of `wt`, four
        // at a time where its rows allow (K a multiple of 4).
        if (k_total % 4 == 0) {
            for (int t = tid; t < chunk * taps * (DF_K / 4); t += DF_THREADS) {
                const int r = t / (DF_K / 4), k = k0 + 4 * (t - r * (DF_K / 4));
                const int row = direct_filter_row(c0 * taps + r, flip, by_taps);
                reinterpret_cast<float4*>(s_w)[t] =
                    k < k_total
                        ? *reinterpret_cast<const float4*>(wt + (long long)row * k_total + k)
                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        } else {
            for (int t = tid; t < chunk * taps * DF_K; t += DF_THREADS) {
                const int r = t / DF_K, k = k0 + t - r * DF_K;
                const int row = direct_filter_row(c0 * taps + r, flip, by_taps);
                s_w[t] = k < k_total ? wt[(long long)row * k_total + k] : 0.0f;
            }
        }
        for (int s = 0; s < d.samples; ++s) {
            const bool sample = n0 + s < g.n;
            const float* xs = x + min(n0 + s, g.n - 1) * sample_values;
            float* s_sample = s_in + s * d.sample_pitch;
            for (int t = tid; t < chunk * channel_values; t += DF_THREADS) {
                const int c = div_by(t, by_channel), rest = t - c * channel_values;
                const int iy = div_by(rest, by_cols), ix = rest - iy * d.in_cols;
                const int yy = y_base + iy, xx = x_base + ix;
                s_sample[c * plane + iy * d.pitch + ix] =
                    (sample && yy >= 0 && yy < g.h && xx >= 0 && xx < g.w)
                        ? xs[((long long)(c0 + c) * g.h + yy) * g.w + xx]
                        : 0.0f;
            }
        }
        __syncthreads();
        const float* w_row = s_w + kq;
        for (int c = 0; c < chunk; ++c) {
            for (int i = 0; i < g.kh; ++i, w_row += g.kw * DF_K) {
                const float* in_row = s_in + c * plane + i * g.dh * d.pitch + lane_offset;
                // Undilated rows of 5 or 3 taps unrolled: the taps' reads then take constant
                // offsets from 8 row addresses instead of 8 address sums per tap.
                if (g.kw == 5 && g.dw == 1) {
                    direct_taps<5>(in_row, w_row, 1, row_step, run_step, acc);
                } else if (g.kw == 3 && g.dw == 1) {
                    direct_taps<3>(in_row, w_row, 1, row_step, run_step, acc);
                } else {
                    for (int j = 0; j < g.kw; ++j) {
                        direct_taps<1>(in_row + j * g.dw, w_row + j * DF_K, g.dw, row_step,
                                       run_step, acc);
                    }
                }
            }
        }
    }
    const int ox = ox0 + lane_col;
    if (ox >= g.ow || n_lane >= g.n) return;
    const bool partial = d.splits > 1;
    float* ys = y + (long long)split * g.n * k_total * g.oh * g.ow;
#pragma unroll
    for (int q = 0; q < DF_KW; ++q) {
        const int k = k0 + kq + q;
        if (k >= k_total) break;
        const float b = has_bias && !partial ? bias[k] : 0.0f;
        float* yk = ys + ((long long)n_lane * k_total + k) * g.oh * g.ow + ox;
#pragma unroll
        for (int t = 0; t < DF_ROWS; ++t) {
            const int oy = oy0 + run_rows * (t / 4) + lane_oy + t % 4;
            if (oy < g.oh) {
                float* out = yk + (long long)oy * g.ow;
                const float v = acc[t][q] + b;
                *out = accumulate && !partial ? v + *out : v;
            }
        }
    }
}

// conv_forward_direct's output from its splits' sums `partial` (splits, N, K, OH·OW):
// y[i] = (partial[0][i] + partial[1][i] + …) in that order, then + bias[k] where `has_bias`,
// then + y[i] where `accumulate`; `count` = N·K·OH·OW, `plane` = OH·OW.
extern "C" __global__ void direct_sum_splits(const float* partial, const float* bias, int has_bias,
                                             int accumulate, float* y, int count, int splits,
                                             int plane, int k_total) {
    const FastDiv by_plane = fast_div(plane), by_k = fast_div(k_total);
    GRID_STRIDE_INT(i, count) {
        float v = partial[i];
        for (int s = 1; s < splits; ++s) v += partial[(long long)s * count + i];
        if (has_bias) v += bias[channel_of(i, by_plane, by_k)];
        y[i] = accumulate ? v + y[i] : v;
    }
}
