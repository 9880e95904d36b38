// ---------------------------------------------------------------------------------------------
// BatchNorm -> Scale -> ReLU fused over (N, C, S): y = (x - mean[c]) * inv_std[c] (BatchNorm),
// v = y * gamma[c] (+ beta[c]) (Scale), z = v > 0 ? v : slope * v (ReLU when relu != 0,
// slope >= 0, so that z > 0 exactly where v > 0). Only z is stored; backward recomputes y and v
// from x (the same operations on the same values: the same bits) and never reads z: the ReLU
// passes its gradient where v > 0, which is where z > 0.
//
// Mixed precision (half = 1 bf16, 2 fp16; 0 none): every value the CPU's three layers would
// round is rounded where they round it, x as it is read, y and v, the leaky part of z, the
// gradient the ReLU and the Scale pass down, and dx, so that the chain computes what they compute.
// The activations x, z, dz and dx may be stored in the half type: each kernel's `_h` twin takes
// them so (load_value and store_value, elementwise.cu) and computes the same numbers.

// The BatchNorm's top y, from its bottom x. In mixed precision x is rounded as it is read: the net
// leaves a top that only such chains read unrounded (rounding a rounded value changes nothing).
__device__ __forceinline__ float bsr_normalized(float x, float mean, float inv_std, int half) {
    return round_if_half((round_if_half(x, half) - mean) * inv_std, half);
}

// The Scale's top v of channel c, from the BatchNorm's top y.
__device__ __forceinline__ float bsr_scaled(float y, float gamma, const float* beta, int has_beta,
                                           int c, int half) {
    float v = y * gamma;
    if (has_beta) v = v + beta[c];
    return round_if_half(v, half);
}

// The Scale's top v, from the chain's bottom x.
__device__ __forceinline__ float bsr_value(float x, float mean, float inv_std, float gamma,
                                          const float* beta, int has_beta, int c, int half) {
    return bsr_scaled(bsr_normalized(x, mean, inv_std, half), gamma, beta, has_beta, c, half);
}

// Eltwise SUM -> ReLU of one element (the residual join, defined with its kernels below):
// relu(c0 * x0 + c1 * x1) with x0 and x1 rounded as they are read, the sum rounded once.
__device__ __forceinline__ float sum2_forward_element(float x0, float x1, float c0, float c1,
                                                      float slope, int half) {
    const float v = fmaf(c1, round_if_half(x1, half), c0 * round_if_half(x0, half));
    return round_if_half(v > 0.0f ? v : slope * v, half);
}

// The gradient g reaching the sum of one element from y and dy.
__device__ __forceinline__ float sum2_gradient(float y, float dy, float slope, int half) {
    const float d = round_if_half(dy, half);
    return y > 0.0f ? d : slope * d;
}

// A bottom's dx of one element: c * g, added to the old one where acc, rounded.
__device__ __forceinline__ float sum2_bottom_gradient(float g, float c, float old, int acc,
                                                      int half) {
    const float v = c * g;
    return round_if_half(acc ? old + v : v, half);
}

// A chain that ends in a residual sum (has_res): z = relu(c0 * b0 + c1 * b1) over the sum's
// bottoms, the Scale's output v and the shortcut r, r being b0 where res_first; the ReLU's
// `relu` and `slope` then those after the sum (the sum's ReLU is always there, `relu` is 1).
struct ResidualSum {
    int has_res, res_first;
    float c0, c1;
};

__device__ __forceinline__ float bsr_sum_element(float v, float r, const ResidualSum& rs,
                                                 float slope, int half) {
    return rs.res_first ? sum2_forward_element(r, v, rs.c0, rs.c1, slope, half)
                        : sum2_forward_element(v, r, rs.c0, rs.c1, slope, half);
}

// The chain's z of one element x of channel ch.
__device__ __forceinline__ float bsr_forward_element(float xi, int ch, const float* mean,
                                                     const float* inv_std, const float* gamma,
                                                     const float* beta, int has_beta, int relu,
                                                     float slope, int half) {
    const float v = bsr_value(xi, mean[ch], inv_std[ch], gamma[ch], beta, has_beta, ch, half);
    return (relu && !(v > 0.0f)) ? round_if_half(slope * v, half) : v;
}

// Forward, over x, the shortcut res (has_res) and z stored as T (float, or half-type bit
// patterns: load_value, store_value).
template <class T>
__device__ __forceinline__ void bsr_forward(const T* x, const float* mean, const float* inv_std,
                                            const float* gamma, const float* beta, int has_beta,
                                            int relu, float slope, const T* res, ResidualSum rs,
                                            T* z, int n, int c, int s, int half) {
    const FastDiv by_s = fast_div(s), by_c = fast_div(c);
    grid_stride_by_four(
        n,
        [=](int i) {
            return make_float2(load_value(x, i, half), rs.has_res ? load_value(res, i, half) : 0.0f);
        },
        [=](int i, float2 in) {
            const int ch = channel_of(i, by_s, by_c);
            float zi;
            if (rs.has_res) {
                const float v = bsr_value(in.x, mean[ch], inv_std[ch], gamma[ch], beta, has_beta,
                                          ch, half);
                zi = bsr_sum_element(v, in.y, rs, slope, half);
            } else {
                zi = bsr_forward_element(in.x, ch, mean, inv_std, gamma, beta, has_beta, relu,
                                         slope, half);
            }
            store_value(z, i, zi, half);
        });
}

// res, has_res, res_first, c0, c1: the residual sum (ResidualSum); res is never read without it.
extern "C" __global__ void bn_scale_relu_forward(const float* x, const float* mean,
                                                 const float* inv_std, const float* gamma,
                                                 const float* beta, int has_beta, int relu,
                                                 float slope, const float* res, int has_res,
                                                 int res_first, float c0, float c1, float* z,
                                                 int n, int c, int s, int half) {
    const ResidualSum rs{has_res, res_first, c0, c1};
    bsr_forward(x, mean, inv_std, gamma, beta, has_beta, relu, slope, res, rs, z, n, c, s, half);
}

// bn_scale_relu_forward on half-type x, res and z.
extern "C" __global__ void bn_scale_relu_forward_h(const unsigned short* x, const float* mean,
                                                   const float* inv_std, const float* gamma,
                                                   const float* beta, int has_beta, int relu,
                                                   float slope, const unsigned short* res,
                                                   int has_res, int res_first, float c0,
                                                   float c1, unsigned short* z, int n, int c,
                                                   int s, int half) {
    const ResidualSum rs{has_res, res_first, c0, c1};
    WITH_HALF_CONSTANT(bsr_forward(x, mean, inv_std, gamma, beta, has_beta, relu, slope, res, rs,
                                   z, n, c, s, half));
}

// The gradient reaching the Scale's output v: g = dz * (relu && !(v > 0) ? slope : 1).
// In mixed precision dz is rounded as it is read, as x is.
__device__ __forceinline__ float bsr_grad(float dz, float v, int relu, float slope, int half) {
    dz = round_if_half(dz, half);
    return (relu && !(v > 0.0f)) ? round_if_half(dz * slope, half) : dz;
}

// The normalised y and the gradient g of element idx of channel ch (bsr_normalized, bsr_grad).
template <class T>
__device__ __forceinline__ float2 bsr_y_and_g(const T* dz, const T* x, int idx, int ch,
                                              const float* mean, const float* inv_std,
                                              const float* gamma, const float* beta, int has_beta,
                                              int relu, float slope, int half) {
    const float y = bsr_normalized(load_value(x, idx, half), mean[ch], inv_std[ch], half);
    const float v = relu ? bsr_scaled(y, gamma[ch], beta, has_beta, ch, half) : 0.0f;
    return make_float2(y, bsr_grad(load_value(dz, idx, half), v, relu, slope, half));
}

// With a residual sum, the sums pass runs the sum's backward too (res_c != 0): it reads the
// chain's top y and its gradient dy in place of dz, forms the gradient reaching the Scale's
// output dz = c * dy * relu'(y) (sum2_gradient, sum2_bottom_gradient: the value the sum's
// backward writes for that bottom) and writes it to dz_out, the shortcut's gradient, which is the
// same value where the sum's coefficients are equal (the launcher's case); the dx pass then reads
// it as dz. res_c == 0: dz read as given (dy and dz_out unread).
template <class T>
__device__ __forceinline__ float bsr_dz_of(const T* dz_or_y, const T* dy, T* dz_out, int idx,
                                           float res_c, float res_slope, int half) {
    if (res_c == 0.0f) return load_value(dz_or_y, idx, half);
    const float g = sum2_gradient(load_value(dz_or_y, idx, half), load_value(dy, idx, half),
                                  res_slope, half);
    const float dz = sum2_bottom_gradient(g, res_c, 0.0f, 0, half);
    store_value(dz_out, idx, dz, half);
    return dz;
}

// The normalised y and the gradient g of element idx of channel ch (bsr_normalized, bsr_grad),
// its dz from bsr_dz_of.
template <class T>
__device__ __forceinline__ float2 bsr_y_and_g(const T* dz_or_y, const T* dy, T* dz_out,
                                              float res_c, float res_slope, const T* x, int idx,
                                              int ch, const float* mean, const float* inv_std,
                                              const float* gamma, const float* beta, int has_beta,
                                              int relu, float slope, int half) {
    const float y = bsr_normalized(load_value(x, idx, half), mean[ch], inv_std[ch], half);
    const float v = relu ? bsr_scaled(y, gamma[ch], beta, has_beta, ch, half) : 0.0f;
    const float dz = bsr_dz_of(dz_or_y, dy, dz_out, idx, res_c, res_slope, half);
    return make_float2(y, bsr_grad(dz, v, relu, slope, half));
}

// Stage 1 of the backward sums, chunked as bn_sums: per channel sum g and sum g * y at
// partial[(ch * splits + k) * 2 + {0, 1}], or with quad (mixed precision) four sums at
// partial[(ch * splits + k) * 4 + {0, 1, 2, 3}]: those two, then sum t and sum t * y of the
// gradient the Scale passes to the BatchNorm, t = gamma * g rounded (whose rounding keeps the
// BatchNorm's sums from being gamma times the Scale's). dz_or_y, dy, dz_out, res_c, res_slope:
// bsr_dz_of.
template <class T>
__device__ __forceinline__ void bsr_sums(const T* dz_or_y, const T* dy, T* dz_out, float res_c,
                                         float res_slope, const T* x, const float* mean,
                                         const float* inv_std, const float* gamma,
                                         const float* beta, int has_beta, int relu, float slope,
                                         double* partial, int n, int c, int s, int splits,
                                         int half, int quad) {
    if (quad) {
        view_sums_n<4>(
            [=](int idx, int ch) {
                const float2 yg = bsr_y_and_g(dz_or_y, dy, dz_out, res_c, res_slope, x, idx, ch,
                                              mean, inv_std, gamma, beta, has_beta, relu, slope,
                                              half);
                const float g = yg.y;
                const float t = round_if_half(gamma[ch] * g, half);
                const double y = (double)yg.x;
                return Sums<4>{{(double)g, (double)g * y, (double)t, (double)t * y}};
            },
            partial, n, c, s, splits);
    } else {
        view_sums(
            [=](int idx, int ch) {
                const float2 yg = bsr_y_and_g(dz_or_y, dy, dz_out, res_c, res_slope, x, idx, ch,
                                              mean, inv_std, gamma, beta, has_beta, relu, slope,
                                              half);
                return make_double2((double)yg.y, (double)yg.y * (double)yg.x);
            },
            partial, 1, n, c, s, splits);
    }
}

extern "C" __global__ void bn_scale_relu_sums(const float* dz_or_y, const float* dy,
                                              float* dz_out, float res_c, float res_slope,
                                              const float* x, const float* mean,
                                              const float* inv_std, const float* gamma,
                                              const float* beta, int has_beta, int relu,
                                              float slope, double* partial, int n, int c, int s,
                                              int splits, int half, int quad) {
    bsr_sums(dz_or_y, dy, dz_out, res_c, res_slope, x, mean, inv_std, gamma, beta, has_beta, relu,
             slope, partial, n, c, s, splits, half, quad);
}

// bn_scale_relu_sums on half-type dz_or_y, dy, dz_out and x.
extern "C" __global__ void bn_scale_relu_sums_h(const unsigned short* dz_or_y,
                                                const unsigned short* dy, unsigned short* dz_out,
                                                float res_c, float res_slope,
                                                const unsigned short* x, const float* mean,
                                                const float* inv_std, const float* gamma,
                                                const float* beta, int has_beta, int relu,
                                                float slope, double* partial, int n, int c, int s,
                                                int splits, int half, int quad) {
    WITH_HALF_CONSTANT(bsr_sums(dz_or_y, dy, dz_out, res_c, res_slope, x, mean, inv_std, gamma,
                                beta, has_beta, relu, slope, partial, n, c, s, splits, half,
                                quad));
}

// Per channel, from the partials: the Scale's local gradient dgamma[c] (+)= sum g*y,
// dbeta[c] (+)= sum g (dparams = [dgamma (C), dbeta (C) if has_beta]) and, where store_sums,
// the BatchNorm sums = [sum g (C), sum g*y (C), n * s], or with quad [sum t, sum t*y, n * s]
// (before any all-reduce). Where zero_state, the BatchNorm state's gradient
// state_diff = [mean (C), var (C), factor] is zeroed (its overwrite, in this launch).
extern "C" __global__ void bn_scale_relu_finish(const double* partial, double* sums,
                                                float* dparams, int has_beta, int c, int splits,
                                                int per, int accumulate, int store_sums,
                                                int quad, float* state_diff, int zero_state) {
    const int stride = quad ? 4 : 2;
    WARP_PER_CHANNEL(ch, c) {
        double s1, s2, b1, b2;
        chunk_sums_at(partial, ch, splits, stride, 0, 2, &s1, &s2);
        if (quad) {
            chunk_sums_at(partial, ch, splits, stride, 2, 2, &b1, &b2);
        } else {
            b1 = s1;
            b2 = s2;
        }
        if ((threadIdx.x & 31) != 0) continue;
        if (store_sums) {
            sums[ch] = b1;
            sums[c + ch] = b2;
            if (ch == 0) sums[2 * c] = (double)per;
        }
        dparams[ch] = accumulate ? dparams[ch] + (float)s2 : (float)s2;
        if (has_beta) dparams[c + ch] = accumulate ? dparams[c + ch] + (float)s1 : (float)s1;
        if (zero_state) {
            state_diff[ch] = 0.0f;
            state_diff[c + ch] = 0.0f;
            if (ch == 0) state_diff[2 * c] = 0.0f;
        }
    }
}

// dx (+)= BatchNorm's backward of dy = gamma * g: with batch statistics
// (dy - mean(dy) - mean(dy * y) * y) * inv_std over m = sums[2C] values, with global ones
// dy * inv_std. The means are gamma * sums[c] / m and gamma * sums[C + c] / m from sums of g,
// or in mixed precision sums[c] / m and sums[C + c] / m from sums of the rounded dy (bn_terms).
// The chain's dx of one element of channel ch from its dz, x (read where batch_stats or relu)
// and (accumulate) old dx.
__device__ __forceinline__ float bsr_backward_element(float dz, float x, float old, int ch,
                                                      const float* mean, const float* inv_std,
                                                      const float* gamma, const float* beta,
                                                      int has_beta, const double* sums,
                                                      double inv_m, int batch_stats, int relu,
                                                      float slope, int c, int accumulate,
                                                      int half) {
    const float gm = gamma[ch];
    const float y =
        (batch_stats || relu) ? bsr_normalized(x, mean[ch], inv_std[ch], half) : 0.0f;
    const float v = relu ? bsr_scaled(y, gm, beta, has_beta, ch, half) : 0.0f;
    const float dy = round_if_half(gm * bsr_grad(dz, v, relu, slope, half), half);
    float d;
    if (batch_stats) {
        float mean_dy = (float)(sums[ch] * inv_m);
        float mean_dyy = (float)(sums[c + ch] * inv_m);
        if (!half) {
            mean_dy = gm * mean_dy;
            mean_dyy = gm * mean_dyy;
        }
        d = (dy - mean_dy - mean_dyy * y) * inv_std[ch];
    } else {
        d = dy * inv_std[ch];
    }
    return round_if_half(accumulate ? old + d : d, half);
}

template <class T>
__device__ __forceinline__ void bsr_backward(const T* dz, const T* x, const float* mean,
                                             const float* inv_std, const float* gamma,
                                             const float* beta, int has_beta, const double* sums,
                                             int batch_stats, int relu, float slope, T* dx,
                                             int n, int c, int s, int accumulate, int half) {
    const FastDiv by_s = fast_div(s), by_c = fast_div(c);
    const double inv_m = batch_stats ? 1.0 / sums[2 * c] : 0.0;
    const bool read_x = batch_stats || relu;
    // The streamed inputs of an element: dz, x and (accumulate) the dx it adds to.
    struct In {
        float dz, x, dx;
    };
    grid_stride_by_four(
        n,
        [=](int i) {
            return In{load_value(dz, i, half), read_x ? load_value(x, i, half) : 0.0f,
                      accumulate ? load_value(dx, i, half) : 0.0f};
        },
        [=](int i, In in) {
            const int ch = channel_of(i, by_s, by_c);
            const float d = bsr_backward_element(in.dz, in.x, in.dx, ch, mean, inv_std, gamma,
                                                 beta, has_beta, sums, inv_m, batch_stats, relu,
                                                 slope, c, accumulate, half);
            store_value(dx, i, d, half);
        });
}

extern "C" __global__ void bn_scale_relu_backward(const float* dz, const float* x,
                                                  const float* mean, const float* inv_std,
                                                  const float* gamma, const float* beta,
                                                  int has_beta, const double* sums,
                                                  int batch_stats, int relu, float slope,
                                                  float* dx, int n, int c, int s, int accumulate,
                                                  int half) {
    bsr_backward(dz, x, mean, inv_std, gamma, beta, has_beta, sums, batch_stats, relu, slope, dx,
                 n, c, s, accumulate, half);
}

// bn_scale_relu_backward on half-type dz, x and dx.
extern "C" __global__ void bn_scale_relu_backward_h(const unsigned short* dz,
                                                    const unsigned short* x, const float* mean,
                                                    const float* inv_std, const float* gamma,
                                                    const float* beta, int has_beta,
                                                    const double* sums, int batch_stats, int relu,
                                                    float slope, unsigned short* dx, int n, int c,
                                                    int s, int accumulate, int half) {
    WITH_HALF_CONSTANT(bsr_backward(dz, x, mean, inv_std, gamma, beta, has_beta, sums,
                                    batch_stats, relu, slope, dx, n, c, s, accumulate, half));
}

// The chain's `_h8` kernels: the `_h` kernels over a channels-last view (s == 1, c % 8 == 0,
// every tensor 16-byte aligned), several adjacent channels a thread (eight in the elementwise
// kernels, four in the sums). One 8- or 16-byte access a tensor for four or eight values, a
// thread's per-channel operands read once for as long as its channels stay the same, values
// rounded and stored two at a time (pack_pair), and no per-element channel index: the same
// results, for the same operations on the same values (a value the `_h` kernels round again is a
// half-type value already). The elementwise ones take `half` and Kernels::grid over their n / 8
// groups of eight; the sums take channels_last_sums' grid (Kernels::grid_channel_sums_by).

// The per-channel operands of channels ch0 .. ch0 + 8.
struct ChainEight {
    float mean[8], inv_std[8], gamma[8], beta[8], mean_dy[8], mean_dyy[8];
};

// The first of the eight channels of each group g (elements 8g .. 8g + 8) of a channels-last
// view of c channels that this thread meets in grid_stride_by over the groups: the same
// channel for every group of the thread when c divides the grid's stride in elements (2,048 times
// the blocks of Kernels::grid_resident: every power of two up to 2,048, ResNet-50's widest),
// computed once; else group by group.
struct GroupChannels {
    int first, c;
    bool fixed;
};

__device__ __forceinline__ GroupChannels group_channels(int c) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    return GroupChannels{(int)((8LL * tid) % c), c, (8LL * stride) % c == 0};
}

__device__ __forceinline__ int group_channel(const GroupChannels& gc, int g) {
    return gc.fixed ? gc.first : (int)((8LL * g) % gc.c);
}

// The first channel of group g, after load(ch0) has read the operands of its eight channels
// where they are not those of the last group this thread loaded (`cached`, -1 before any).
template <class Load>
__device__ __forceinline__ int group_channel_loaded(const GroupChannels& gc, int g, int& cached,
                                                    Load load) {
    const int ch0 = group_channel(gc, g);
    if (ch0 != cached) {
        cached = ch0;
        load(ch0);
    }
    return ch0;
}

// p[ch0 .. ch0 + V) into out (V a multiple of 4): 16-byte loads where p + ch0 is 16-byte
// aligned, else V 4-byte ones.
template <int V = 8>
__device__ __forceinline__ void load_channels(const float* p, int ch0, float* out) {
    const float* q = p + ch0;
    if ((reinterpret_cast<unsigned long long>(q) & 15) == 0) {
#pragma unroll
        for (int j = 0; j < V / 4; ++j) {
            const float4 a = reinterpret_cast<const float4*>(q)[j];
            out[4 * j] = a.x;
            out[4 * j + 1] = a.y;
            out[4 * j + 2] = a.z;
            out[4 * j + 3] = a.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < V; ++e) out[e] = q[e];
    }
}

// g of two elements (bsr_grad), from their dz and Scale's output v.
template <int HALF>
__device__ __forceinline__ void bsr_grad_pair(float dz0, float dz1, float v0, float v1, int relu,
                                              float slope, float& g0, float& g1) {
    g0 = (relu && !(v0 > 0.0f)) ? dz0 * slope : dz0;
    g1 = (relu && !(v1 > 0.0f)) ? dz1 * slope : dz1;
    round_pair<HALF>(g0, g1);
}

// The normalised y of two elements of channels e, e + 1 (bsr_normalized).
template <int HALF>
__device__ __forceinline__ void bsr_normalized_pair(const ChainEight& p, int e, float x0,
                                                    float x1, float& y0, float& y1) {
    y0 = (x0 - p.mean[e]) * p.inv_std[e];
    y1 = (x1 - p.mean[e + 1]) * p.inv_std[e + 1];
    round_pair<HALF>(y0, y1);
}

// The Scale's output v of two elements of channels e, e + 1 from their y (bsr_scaled).
template <int HALF>
__device__ __forceinline__ void bsr_scaled_pair(const ChainEight& p, int e, float y0, float y1,
                                                int has_beta, float& v0, float& v1) {
    v0 = y0 * p.gamma[e];
    v1 = y1 * p.gamma[e + 1];
    if (has_beta) {
        v0 = v0 + p.beta[e];
        v1 = v1 + p.beta[e + 1];
    }
    round_pair<HALF>(v0, v1);
}

// The elementwise `_h8` kernels run grid_stride_by over the n / 8 groups of eight, on a grid of
// the blocks resident at once (Kernels::grid_resident: no block waits for a second wave): the
// forward with two groups' loads in flight a thread and four blocks a multiprocessor, the
// backward (three tensors read, up to six sets of per-channel operands held) with one and three
// (__launch_bounds__, under which ptxas keeps a few of the backward's operands in local memory).
// Each thread reloads its channels' operands only when its group's channels change (never, when
// c divides the grid's stride in elements).
template <int HALF, bool RES>
__device__ __forceinline__ void bsr_forward_by_eight(const unsigned short* x, const float* mean,
                                                     const float* inv_std, const float* gamma,
                                                     const float* beta, int has_beta, int relu,
                                                     float slope, const unsigned short* res,
                                                     const ResidualSum& rs, unsigned short* z,
                                                     int n, int c) {
    const GroupChannels gc = group_channels(c);
    ChainEight p;
    int cached = -1;
    // A group's eight values of x and, with a residual sum, of the shortcut.
    struct In {
        uint4 x, r;
    };
    // Two groups' loads in flight, one with the shortcut's (which two would spill).
    grid_stride_by<RES ? 1 : 2>(
        n >> 3,
        [=](int g) { return In{raw_eight(x, g), RES ? raw_eight(res, g) : make_uint4(0, 0, 0, 0)}; },
        [&](int g, const In& in) {
            group_channel_loaded(gc, g, cached, [&](int ch0) {
                load_channels(mean, ch0, p.mean);
                load_channels(inv_std, ch0, p.inv_std);
                load_channels(gamma, ch0, p.gamma);
                if (has_beta) load_channels(beta, ch0, p.beta);
            });
            Eight v = widen_eight<HALF>(in.x);
            const Eight r = widen_eight<HALF>(in.r);
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                float y0, y1, v0, v1;
                bsr_normalized_pair<HALF>(p, e, v.v[e], v.v[e + 1], y0, y1);
                bsr_scaled_pair<HALF>(p, e, y0, y1, has_beta, v0, v1);
                if (RES) {
                    // The shortcut holds half-type values: the sum's rounding on load keeps them.
                    v0 = bsr_sum_element(v0, r.v[e], rs, slope, HALF);
                    v1 = bsr_sum_element(v1, r.v[e + 1], rs, slope, HALF);
                } else {
                    // The leaky part is rounded by the store.
                    if (relu && !(v0 > 0.0f)) v0 = slope * v0;
                    if (relu && !(v1 > 0.0f)) v1 = slope * v1;
                }
                v.v[e] = v0;
                v.v[e + 1] = v1;
            }
            store_eight_pairs<HALF>(z, g << 3, v);
        });
}

// res, has_res, res_first, c0, c1 as bn_scale_relu_forward's.
extern "C" __global__ void __launch_bounds__(256, 4) bn_scale_relu_forward_h8(
    const unsigned short* x, const float* mean, const float* inv_std, const float* gamma,
    const float* beta, int has_beta, int relu, float slope, const unsigned short* res, int has_res,
    int res_first, float c0, float c1, unsigned short* z, int n, int c, int half) {
    const ResidualSum rs{has_res, res_first, c0, c1};
#define BSR_FORWARD_BY_EIGHT(H, R)                                                                \
    bsr_forward_by_eight<H, R>(x, mean, inv_std, gamma, beta, has_beta, relu, slope, res, rs, z,  \
                               n, c)
    if (half == 2) {
        if (has_res) {
            BSR_FORWARD_BY_EIGHT(2, true);
        } else {
            BSR_FORWARD_BY_EIGHT(2, false);
        }
    } else if (has_res) {
        BSR_FORWARD_BY_EIGHT(1, true);
    } else {
        BSR_FORWARD_BY_EIGHT(1, false);
    }
#undef BSR_FORWARD_BY_EIGHT
}

// Stage 1 of the backward sums (bsr_sums, N = 4 with quad, else 2), four channels a thread
// (channels_last_sums, V = 4): eight held 64 registers of the four sums' accumulators, over 128
// in all, and left one block of 256 threads a multiprocessor. Four rows' loads in flight a
// thread, under __launch_bounds__ for three blocks a multiprocessor (80 registers, no spills);
// with a residual sum (RES: y, dy and x read, dz written, bsr_dz_of) under two (116 registers).
template <int HALF, int N, bool RES>
__device__ __forceinline__ void bsr_sums_by_four(const unsigned short* dz_or_y,
                                                 const unsigned short* dy,
                                                 unsigned short* dz_out, float res_c,
                                                 float res_slope, const unsigned short* x,
                                                 const float* mean, const float* inv_std,
                                                 const float* gamma, const float* beta,
                                                 int has_beta, int relu, float slope,
                                                 double* rows, double* partial, int n, int c,
                                                 int splits) {
    const int d0 = 4 * (blockIdx.y * blockDim.x + threadIdx.x);
    ChainEight p;
    if (d0 < c) {
        load_channels<4>(mean, d0, p.mean);
        load_channels<4>(inv_std, d0, p.inv_std);
        load_channels<4>(gamma, d0, p.gamma);
        if (relu && has_beta) load_channels<4>(beta, d0, p.beta);
    }
    // A row's four elements of each tensor (dy and the row's group only with RES).
    struct In {
        uint2 dz, x, dy;
        int g;
    };
    channels_last_sums<N, 4, 4>(
        [=](int idx0) {
            const int g = idx0 >> 2;
            return In{raw_four(dz_or_y, g), raw_four(x, g),
                      RES ? raw_four(dy, g) : make_uint2(0u, 0u), g};
        },
        [=](const In& in, Sums<N>* acc) {
            unsigned wdz[2] = {in.dz.x, in.dz.y};
            const unsigned wx[2] = {in.x.x, in.x.y};
            if (RES) {
                // dz = res_c * dy * relu'(y), rounded (bsr_dz_of on half-type values).
                const unsigned wy[2] = {in.dz.x, in.dz.y}, wdy[2] = {in.dy.x, in.dy.y};
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const float2 vy = unpack_pair<HALF>(wy[j]), vdy = unpack_pair<HALF>(wdy[j]);
                    const float g0 = vy.x > 0.0f ? vdy.x : res_slope * vdy.x;
                    const float g1 = vy.y > 0.0f ? vdy.y : res_slope * vdy.y;
                    wdz[j] = pack_pair<HALF>(res_c * g0, res_c * g1);
                }
                reinterpret_cast<uint2*>(dz_out)[in.g] = make_uint2(wdz[0], wdz[1]);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int e = 2 * j;
                const float2 vdz = unpack_pair<HALF>(wdz[j]), vx = unpack_pair<HALF>(wx[j]);
                float g0, g1, y0, y1, v0 = 0.0f, v1 = 0.0f;
                bsr_normalized_pair<HALF>(p, e, vx.x, vx.y, y0, y1);
                if (relu) bsr_scaled_pair<HALF>(p, e, y0, y1, has_beta, v0, v1);
                bsr_grad_pair<HALF>(vdz.x, vdz.y, v0, v1, relu, slope, g0, g1);
                const double yd0 = (double)y0, yd1 = (double)y1;
                acc[e].v[0] += (double)g0;
                acc[e].v[1] += (double)g0 * yd0;
                acc[e + 1].v[0] += (double)g1;
                acc[e + 1].v[1] += (double)g1 * yd1;
                if constexpr (N == 4) {
                    float t0 = p.gamma[e] * g0, t1 = p.gamma[e + 1] * g1;
                    round_pair<HALF>(t0, t1);
                    acc[e].v[2] += (double)t0;
                    acc[e].v[3] += (double)t0 * yd0;
                    acc[e + 1].v[2] += (double)t1;
                    acc[e + 1].v[3] += (double)t1 * yd1;
                }
            }
        },
        rows, partial, n, c, splits);
}

// bn_scale_relu_sums_h over a channels-last view, launched as channels_last_sums says (V = 4),
// without a residual sum (dy, dz_out, res_c and res_slope unread; bn_scale_relu_sums_res_h8
// with one).
extern "C" __global__ void __launch_bounds__(256, 3) bn_scale_relu_sums_h8(
    const unsigned short* dz_or_y, const unsigned short* dy, unsigned short* dz_out, float res_c,
    float res_slope, const unsigned short* x, const float* mean, const float* inv_std,
    const float* gamma, const float* beta, int has_beta, int relu, float slope, double* partial,
    int n, int c, int splits, int half, int quad) {
    __shared__ double rows[CHANNELS_LAST_ROWS];
#define BSR_SUMS_BY_FOUR(H, N, R)                                                                 \
    bsr_sums_by_four<H, N, R>(dz_or_y, dy, dz_out, res_c, res_slope, x, mean, inv_std, gamma,     \
                              beta, has_beta, relu, slope, rows, partial, n, c, splits)
    if (half == 2) {
        if (quad) {
            BSR_SUMS_BY_FOUR(2, 4, false);
        } else {
            BSR_SUMS_BY_FOUR(2, 2, false);
        }
    } else if (quad) {
        BSR_SUMS_BY_FOUR(1, 4, false);
    } else {
        BSR_SUMS_BY_FOUR(1, 2, false);
    }
}

// bn_scale_relu_sums_h8 with a residual sum (res_c != 0): y, dy and x read, dz written. In a
// kernel of its own, under __launch_bounds__ for two blocks a multiprocessor: in the kernel
// above, its three tensors spilled the accumulators whatever the rows in flight.
extern "C" __global__ void __launch_bounds__(256, 2) bn_scale_relu_sums_res_h8(
    const unsigned short* dz_or_y, const unsigned short* dy, unsigned short* dz_out, float res_c,
    float res_slope, const unsigned short* x, const float* mean, const float* inv_std,
    const float* gamma, const float* beta, int has_beta, int relu, float slope, double* partial,
    int n, int c, int splits, int half, int quad) {
    __shared__ double rows[CHANNELS_LAST_ROWS];
    if (half == 2) {
        if (quad) {
            BSR_SUMS_BY_FOUR(2, 4, true);
        } else {
            BSR_SUMS_BY_FOUR(2, 2, true);
        }
    } else if (quad) {
        BSR_SUMS_BY_FOUR(1, 4, true);
    } else {
        BSR_SUMS_BY_FOUR(1, 2, true);
    }
#undef BSR_SUMS_BY_FOUR
}

template <int HALF>
__device__ __forceinline__ void bsr_backward_by_eight(
    const unsigned short* dz, const unsigned short* x, const float* mean, const float* inv_std,
    const float* gamma, const float* beta, int has_beta, const double* sums, int batch_stats,
    int relu, float slope, unsigned short* dx, int n, int c, int accumulate) {
    const GroupChannels gc = group_channels(c);
    const double inv_m = batch_stats ? 1.0 / sums[2 * c] : 0.0;
    const bool read_x = batch_stats || relu;
    const uint4 none = make_uint4(0u, 0u, 0u, 0u);
    // The streamed inputs of a group: dz, x (batch statistics or a ReLU) and the dx it adds to.
    struct In {
        uint4 dz, x, dx;
    };
    ChainEight p;
    int cached = -1;
    grid_stride_by<1>(
        n >> 3,
        [=](int g) {
            return In{raw_eight(dz, g), read_x ? raw_eight(x, g) : none,
                      accumulate ? raw_eight(dx, g) : none};
        },
        [&](int g, const In& in) {
            group_channel_loaded(gc, g, cached, [&](int ch0) {
                load_channels(inv_std, ch0, p.inv_std);
                load_channels(gamma, ch0, p.gamma);
                if (read_x) load_channels(mean, ch0, p.mean);
                if (relu && has_beta) load_channels(beta, ch0, p.beta);
                if (batch_stats) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        p.mean_dy[e] = (float)(sums[ch0 + e] * inv_m);
                        p.mean_dyy[e] = (float)(sums[c + ch0 + e] * inv_m);
                    }
                }
            });
            const Eight vdz = widen_eight<HALF>(in.dz), vx = widen_eight<HALF>(in.x);
            Eight out = widen_eight<HALF>(in.dx);
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                float y0 = 0.0f, y1 = 0.0f, v0 = 0.0f, v1 = 0.0f, g0, g1;
                if (read_x) bsr_normalized_pair<HALF>(p, e, vx.v[e], vx.v[e + 1], y0, y1);
                if (relu) bsr_scaled_pair<HALF>(p, e, y0, y1, has_beta, v0, v1);
                bsr_grad_pair<HALF>(vdz.v[e], vdz.v[e + 1], v0, v1, relu, slope, g0, g1);
                float dy0 = p.gamma[e] * g0, dy1 = p.gamma[e + 1] * g1;
                round_pair<HALF>(dy0, dy1);
                float d0, d1;
                if (batch_stats) {
                    d0 = (dy0 - p.mean_dy[e] - p.mean_dyy[e] * y0) * p.inv_std[e];
                    d1 = (dy1 - p.mean_dy[e + 1] - p.mean_dyy[e + 1] * y1) * p.inv_std[e + 1];
                } else {
                    d0 = dy0 * p.inv_std[e];
                    d1 = dy1 * p.inv_std[e + 1];
                }
                // Rounded by the store.
                out.v[e] = accumulate ? out.v[e] + d0 : d0;
                out.v[e + 1] = accumulate ? out.v[e + 1] + d1 : d1;
            }
            store_eight_pairs<HALF>(dx, g << 3, out);
        });
}

extern "C" __global__ void __launch_bounds__(256, 3) bn_scale_relu_backward_h8(
    const unsigned short* dz, const unsigned short* x, const float* mean, const float* inv_std,
    const float* gamma, const float* beta, int has_beta, const double* sums, int batch_stats,
    int relu, float slope, unsigned short* dx, int n, int c, int accumulate, int half) {
    if (half == 2) {
        bsr_backward_by_eight<2>(dz, x, mean, inv_std, gamma, beta, has_beta, sums, batch_stats,
                                 relu, slope, dx, n, c, accumulate);
    } else {
        bsr_backward_by_eight<1>(dz, x, mean, inv_std, gamma, beta, has_beta, sums, batch_stats,
                                 relu, slope, dx, n, c, accumulate);
    }
}

// ---------------------------------------------------------------------------------------------
// Eltwise SUM of two bottoms fused with the ReLU after it (a residual block's join):
// y = relu(c0 * x0 + c1 * x1), the sum rounded as the unfused layers do (c0 * x0, then + c1 * x1).
// Mixed precision (half as above; the net fuses only a ReLU of slope 0 then, which commutes with
// the rounding): y and each dx rounded as the CPU rounds the ReLU's top and the sum's gradients,
// and x0, x1 and dy as they are read (the net may leave them unrounded for this pair to round).
// The `_h` twins take every tensor stored in the half type, as the chain's above.

template <class T>
__device__ __forceinline__ void sum2_forward(const T* x0, const T* x1, float c0, float c1,
                                             float slope, T* y, int n, int half) {
    grid_stride_by_four(
        n, [=](int i) { return make_float2(load_value(x0, i, half), load_value(x1, i, half)); },
        [=](int i, float2 in) {
            store_value(y, i, sum2_forward_element(in.x, in.y, c0, c1, slope, half), half);
        });
}

extern "C" __global__ void sum2_relu_forward(const float* x0, const float* x1, float c0, float c1,
                                             float slope, float* y, int n, int half) {
    sum2_forward(x0, x1, c0, c1, slope, y, n, half);
}

// The body of sum2_relu_forward_h, inlined with `half` a constant (WITH_HALF_CONSTANT).
__device__ __forceinline__ void sum2_forward_by_eight(const unsigned short* x0,
                                                      const unsigned short* x1, float c0, float c1,
                                                      float slope, unsigned short* y, int n,
                                                      int half) {
    if (!by_eight(n, x0, x1, y)) {
        sum2_forward(x0, x1, c0, c1, slope, y, n, half);
        return;
    }
    GRID_STRIDE_INT(g, n >> 3) {
        const int i0 = g << 3;
        const Eight a = load_eight(x0, i0, half);
        Eight b = load_eight(x1, i0, half);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            b.v[j] = sum2_forward_element(a.v[j], b.v[j], c0, c1, slope, half);
        }
        store_eight(y, i0, b, half);
    }
}

// sum2_relu_forward on half-type x0, x1 and y.
extern "C" __global__ void sum2_relu_forward_h(const unsigned short* x0, const unsigned short* x1,
                                               float c0, float c1, float slope,
                                               unsigned short* y, int n, int half) {
    WITH_HALF_CONSTANT(sum2_forward_by_eight(x0, x1, c0, c1, slope, y, n, half));
}

// g = dy * relu'(y) (y > 0 exactly where the sum is, for slope >= 0); dx_k (+)= c_k * g for each
// bottom k that wants its gradient (want_k).
template <class T>
__device__ __forceinline__ void sum2_backward(const T* y, const T* dy, float c0, float c1,
                                              float slope, T* dx0, T* dx1, int want0, int want1,
                                              int acc0, int acc1, int n, int half) {
    // The streamed inputs of an element: y, dy and the bottom diffs it adds to (two distinct
    // buffers: the launcher borrows both mutably).
    struct In {
        float y, dy, dx0, dx1;
    };
    grid_stride_by_four(
        n,
        [=](int i) {
            return In{load_value(y, i, half), load_value(dy, i, half),
                      want0 && acc0 ? load_value(dx0, i, half) : 0.0f,
                      want1 && acc1 ? load_value(dx1, i, half) : 0.0f};
        },
        [=](int i, In in) {
            const float g = sum2_gradient(in.y, in.dy, slope, half);
            if (want0) store_value(dx0, i, sum2_bottom_gradient(g, c0, in.dx0, acc0, half), half);
            if (want1) store_value(dx1, i, sum2_bottom_gradient(g, c1, in.dx1, acc1, half), half);
        });
}

extern "C" __global__ void sum2_relu_backward(const float* y, const float* dy, float c0, float c1,
                                              float slope, float* dx0, float* dx1, int want0,
                                              int want1, int acc0, int acc1, int n, int half) {
    sum2_backward(y, dy, c0, c1, slope, dx0, dx1, want0, want1, acc0, acc1, n, half);
}

// The body of sum2_relu_backward_h, inlined with `half` a constant (WITH_HALF_CONSTANT).
__device__ __forceinline__ void sum2_backward_by_eight(const unsigned short* y,
                                                       const unsigned short* dy, float c0, float c1,
                                                       float slope,
                                                       unsigned short* dx0, unsigned short* dx1,
                                                       int want0, int want1, int acc0, int acc1,
                                                       int n, int half) {
    if (!by_eight(n, y, dy, dx0, dx1)) {
        sum2_backward(y, dy, c0, c1, slope, dx0, dx1, want0, want1, acc0, acc1, n, half);
        return;
    }
    const Eight zero = {};
    GRID_STRIDE_INT(g8, n >> 3) {
        const int i0 = g8 << 3;
        const Eight vy = load_eight(y, i0, half), vdy = load_eight(dy, i0, half);
        Eight a = want0 && acc0 ? load_eight(dx0, i0, half) : zero;
        Eight b = want1 && acc1 ? load_eight(dx1, i0, half) : zero;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float g = sum2_gradient(vy.v[j], vdy.v[j], slope, half);
            a.v[j] = sum2_bottom_gradient(g, c0, a.v[j], acc0, half);
            b.v[j] = sum2_bottom_gradient(g, c1, b.v[j], acc1, half);
        }
        if (want0) store_eight(dx0, i0, a, half);
        if (want1) store_eight(dx1, i0, b, half);
    }
}

// sum2_relu_backward on half-type y, dy, dx0 and dx1.
extern "C" __global__ void sum2_relu_backward_h(const unsigned short* y, const unsigned short* dy,
                                                float c0, float c1, float slope,
                                                unsigned short* dx0, unsigned short* dx1,
                                                int want0, int want1, int acc0, int acc1, int n,
                                                int half) {
    WITH_HALF_CONSTANT(sum2_backward_by_eight(y, dy, c0, c1, slope, dx0, dx1, want0, want1, acc0,
                                              acc1, n, half));
}
