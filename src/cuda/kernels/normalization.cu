// ---------------------------------------------------------------------------------------------
// BatchNorm over (N, C, S = H * W), statistics in double. sums holds 2C + 1 doubles:
// [sum a (C), sum a*b or a*a (C), count].

// Stage 1 of the sums (see the per-channel reductions above) over the view (n, c, s): over
// chunk k of channel ch, partial[(ch * splits + k) * 2] = sum a,
// partial[... + 1] = sum a * (has_b ? b : a), with a rounded to the half type `half` as it is
// read (round_if_half). a and b stored as T (float, or half-type bit patterns for bn_sums_h:
// load_value).
template <class T>
__device__ __forceinline__ void bn_sums_of(const T* a, const T* b, int has_b, double* partial,
                                           int n, int c, int s, int splits, int half) {
    view_sums(
        [=](int idx, int) {
            const double v = (double)round_if_half(load_value(a, idx, half), half);
            return make_double2(v, v * (has_b ? (double)load_value(b, idx, half) : v));
        },
        partial, 1, n, c, s, splits);
}

extern "C" __global__ void bn_sums(const float* a, const float* b, int has_b, double* partial,
                                   int n, int c, int s, int splits, int half) {
    bn_sums_of(a, b, has_b, partial, n, c, s, splits, half);
}

// bn_sums of half-type a and b (the statistics of a BatchNorm chain's half-type bottom).
extern "C" __global__ void bn_sums_h(const unsigned short* a, const unsigned short* b, int has_b,
                                     double* partial, int n, int c, int s, int splits, int half) {
    WITH_HALF_CONSTANT(bn_sums_of(a, b, has_b, partial, n, c, s, splits, half));
}

// bn_sums_h of a alone (no b) over a channels-last view (s == 1, c % 8 == 0, a 16-byte
// aligned), eight channels a thread (channels_last_sums): the same partials.
template <int HALF>
__device__ __forceinline__ void bn_sums_by_eight(const unsigned short* a, double* rows,
                                                 double* partial, int n, int c, int splits) {
    channels_last_sums<2, 8, 8>(
        [=](int idx0) { return raw_eight(a, idx0 >> 3); },
        [=](const uint4& in, Sums<2>* acc) {
            const unsigned w[4] = {in.x, in.y, in.z, in.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 v = unpack_pair<HALF>(w[j]);
                const double v0 = (double)v.x, v1 = (double)v.y;
                acc[2 * j].v[0] += v0;
                acc[2 * j].v[1] += v0 * v0;
                acc[2 * j + 1].v[0] += v1;
                acc[2 * j + 1].v[1] += v1 * v1;
            }
        },
        rows, partial, n, c, splits);
}

// bn_sums_h of a alone over a channels-last view, launched as channels_last_sums says (V = 8).
extern "C" __global__ void bn_sums_h8(const unsigned short* a, double* partial, int n, int c,
                                      int splits, int half) {
    __shared__ double rows[CHANNELS_LAST_ROWS];
    if (half == 2) {
        bn_sums_by_eight<2>(a, rows, partial, n, c, splits);
    } else {
        bn_sums_by_eight<1>(a, rows, partial, n, c, splits);
    }
}

// Channel ch's warp sums its pairs of partials into s1, s2 (every lane); lane 0 stores
// sums[ch] = s1, sums[C + ch] = s2 and, for channel 0, sums[2C] = per, and answers true (the
// other lanes false).
__device__ __forceinline__ bool bn_store_sums(const double* partial, double* sums, int ch, int c,
                                              int splits, int per, double* s1, double* s2) {
    chunk_sums(partial, ch, splits, 2, s1, s2);
    if ((threadIdx.x & 31) != 0) return false;
    sums[ch] = *s1;
    sums[c + ch] = *s2;
    if (ch == 0) sums[2 * c] = (double)per;
    return true;
}

// Per channel c: sums[c] = sum a, sums[C + c] = sum a * (b or a), from the partials;
// sums[2C] = n * s.
extern "C" __global__ void bn_sums_finish(const double* partial, double* sums, int c, int splits,
                                          int per) {
    WARP_PER_CHANNEL(ch, c) {
        double s1, s2;
        bn_store_sums(partial, sums, ch, c, splits, per, &s1, &s2);
    }
}

// Batch statistics of channel ch from s1 = sum x and s2 = sum x^2 over m values: mean, biased
// variance, inv_std = 1 / sqrt(var + eps).
__device__ __forceinline__ void bn_channel_stats(double s1, double s2, double m, float eps, int ch,
                                                 float* mean, float* var, float* inv_std) {
    const double mu = s1 / m;
    double v = s2 / m - mu * mu;
    if (v < 0.0) v = 0.0;
    mean[ch] = (float)mu;
    var[ch] = (float)v;
    inv_std[ch] = 1.0f / sqrtf((float)v + eps);
}

// Batch statistics from the sums of x and x^2 over m = sums[2C] values (bn_channel_stats).
extern "C" __global__ void bn_batch_stats(const double* sums, int c, float eps, float* mean,
                                          float* var, float* inv_std) {
    GRID_STRIDE_INT(ch, c) {
        bn_channel_stats(sums[ch], sums[c + ch], sums[2 * c], eps, ch, mean, var, inv_std);
    }
}

// bn_sums_finish, then bn_batch_stats of the sums it stores (in one launch, where nothing
// all-reduces the sums between): the same values, from the same doubles.
extern "C" __global__ void bn_sums_finish_stats(const double* partial, double* sums, int c,
                                                int splits, int per, float eps, float* mean,
                                                float* var, float* inv_std) {
    WARP_PER_CHANNEL(ch, c) {
        double s1, s2;
        if (bn_store_sums(partial, sums, ch, c, splits, per, &s1, &s2)) {
            bn_channel_stats(s1, s2, (double)per, eps, ch, mean, var, inv_std);
        }
    }
}

// Global statistics from the running ones in params = [mean (C), var (C), factor (1)]:
// s = factor == 0 ? 0 : 1 / factor; mean = running_mean * s, var = running_var * s.
extern "C" __global__ void bn_global_stats(const float* params, int c, float eps, float* mean,
                                           float* var, float* inv_std) {
    const float f = params[2 * c];
    const float s = f == 0.0f ? 0.0f : 1.0f / f;
    GRID_STRIDE_INT(ch, c) {
        mean[ch] = params[ch] * s;
        var[ch] = params[c + ch] * s;
        inv_std[ch] = 1.0f / sqrtf(var[ch] + eps);
    }
}

// y = (x - mean[c]) * inv_std[c]
extern "C" __global__ void bn_normalize(const float* x, const float* mean, const float* inv_std,
                                        float* y, int n, int c, int s) {
    const FastDiv by_s = fast_div(s), by_c = fast_div(c);
    GRID_STRIDE_INT(i, n) {
        const int ch = channel_of(i, by_s, by_c);
        y[i] = (x[i] - mean[ch]) * inv_std[ch];
    }
}

// factor = factor * maf + 1; running_mean = running_mean * maf + mean;
// running_var = running_var * maf + (m / (m - 1)) * var, m = sums[2C] (correction 1 if m <= 1).
extern "C" __global__ void bn_update_running(float* params, const float* mean, const float* var,
                                             const double* sums, int c, float maf) {
    const double m = sums[2 * c];
    const float corr = m > 1.0 ? (float)(m / (m - 1.0)) : 1.0f;
    GRID_STRIDE_INT(ch, c) {
        params[ch] = params[ch] * maf + mean[ch];
        params[c + ch] = params[c + ch] * maf + corr * var[ch];
        if (ch == 0) params[2 * c] = params[2 * c] * maf + 1.0f;
    }
}

// Batch statistics: dx (+)= (dy - mean(dy) - mean(dy * y) * y) * inv_std, the means over
// m = sums[2C] values from sums = [sum dy (C), sum dy*y (C), m].
extern "C" __global__ void bn_backward(const float* dy, const float* y, const double* sums,
                                       const float* inv_std, float* dx, int n, int c, int s,
                                       int accumulate) {
    const double inv_m = 1.0 / sums[2 * c];
    const FastDiv by_s = fast_div(s), by_c = fast_div(c);
    GRID_STRIDE_INT(i, n) {
        const int ch = channel_of(i, by_s, by_c);
        const float mean_dy = (float)(sums[ch] * inv_m);
        const float mean_dyy = (float)(sums[c + ch] * inv_m);
        const float g = (dy[i] - mean_dy - mean_dyy * y[i]) * inv_std[ch];
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

// Global statistics: dx (+)= dy * inv_std
extern "C" __global__ void bn_backward_global(const float* dy, const float* inv_std, float* dx,
                                              int n, int c, int s, int accumulate) {
    const FastDiv by_s = fast_div(s), by_c = fast_div(c);
    GRID_STRIDE_INT(i, n) {
        const float g = dy[i] * inv_std[channel_of(i, by_s, by_c)];
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

// ---------------------------------------------------------------------------------------------
// LRN over (N, C, H, W): value i's window is channels c - half ..= c + half at its position
// (within 0) or the square rows h - half ..= h + half, columns w - half ..= w + half of its
// channel (within 1), clipped, visited in index order as the CPU layer visits it.

template <class F>
__device__ __forceinline__ void lrn_window(int i, int channels, int height, int width, int half,
                                           int within, F f) {
    const int x = i % width;
    int rest = i / width;
    const int y = rest % height;
    rest /= height;
    const int c = rest % channels;
    const int n = rest / channels;
    if (!within) {
        const int end = min(c + half + 1, channels);
        for (int cj = max(c - half, 0); cj < end; ++cj)
            f(((n * channels + cj) * height + y) * width + x);
    } else {
        const int yend = min(y + half + 1, height), xend = min(x + half + 1, width);
        for (int yj = max(y - half, 0); yj < yend; ++yj)
            for (int xj = max(x - half, 0); xj < xend; ++xj)
                f(((n * channels + c) * height + yj) * width + xj);
    }
}

// scale = k + c * (sum of x^2 over the window / d); y = x * scale^-beta
extern "C" __global__ void lrn_forward(const float* x, float* scale, float* y, int n, int channels,
                                       int height, int width, int half, int within, float k,
                                       float c, float d, float beta) {
    GRID_STRIDE_INT(i, n) {
        float sum = 0.0f;
        lrn_window(i, channels, height, width, half, within,
                   [&](int j) { sum = sum + x[j] * x[j]; });
        const float s = k + c * (sum / d);
        scale[i] = s;
        y[i] = x[i] * powf(s, -beta);
    }
}

// dx (+)= dy * scale^-beta - factor * x * sum over the window of dy * y / scale
extern "C" __global__ void lrn_backward(const float* x, const float* y, const float* dy,
                                        const float* scale, float* dx, int n, int channels,
                                        int height, int width, int half, int within, float beta,
                                        float factor, int accumulate) {
    GRID_STRIDE_INT(i, n) {
        float acc = 0.0f;
        lrn_window(i, channels, height, width, half, within,
                   [&](int j) { acc = acc + dy[j] * y[j] / scale[j]; });
        const float g = dy[i] * powf(scale[i], -beta) - factor * x[i] * acc;
        dx[i] = accumulate ? dx[i] + g : g;
    }
}
