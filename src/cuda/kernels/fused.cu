// ---------------------------------------------------------------------------------------------
// BatchNorm -> Scale -> ReLU fused over (N, C, S): y = (x - mean[c]) * inv_std[c] (BatchNorm),
// v = y * gamma[c] (+ beta[c]) (Scale), z = v > 0 ? v : slope * v (ReLU when relu != 0,
// slope >= 0, so that z > 0 exactly where v > 0). Only z is stored; backward recomputes y from x.

__device__ __forceinline__ float bsr_value(float x, float mean, float inv_std, float gamma,
                                          const float* beta, int has_beta, int c) {
    float v = (x - mean) * inv_std;
    v = v * gamma;
    if (has_beta) v = v + beta[c];
    return v;
}

extern "C" __global__ void bn_scale_relu_forward(const float* x, const float* mean,
                                                 const float* inv_std, const float* gamma,
                                                 const float* beta, int has_beta, int relu,
                                                 float slope, float* z, int n, int c, int s) {
    const FastDiv by_s = fast_div(s), by_c = fast_div(c);
    GRID_STRIDE_INT(i, n) {
        const int ch = channel_of(i, by_s, by_c);
        const float v = bsr_value(x[i], mean[ch], inv_std[ch], gamma[ch], beta, has_beta, ch);
        z[i] = (relu && !(v > 0.0f)) ? slope * v : v;
    }
}

// The gradient reaching the Scale's output: g = dz * (relu && !(z > 0) ? slope : 1).
__device__ __forceinline__ float bsr_grad(float dz, float z, int relu, float slope) {
    return (relu && !(z > 0.0f)) ? dz * slope : dz;
}

// Stage 1 of the backward sums, chunked as bn_sums: partial[(ch * splits + k) * 2] = sum g,
// partial[... + 1] = sum g * y.
extern "C" __global__ void bn_scale_relu_sums(const float* dz, const float* z, const float* x,
                                              const float* mean, const float* inv_std, int relu,
                                              float slope, double* partial, int n, int c, int s,
                                              int splits) {
    view_sums(
        [=](int idx, int ch) {
            const float g = bsr_grad(dz[idx], z[idx], relu, slope);
            const float y = (x[idx] - mean[ch]) * inv_std[ch];
            return make_double2((double)g, (double)g * (double)y);
        },
        partial, 1, n, c, s, splits);
}

// Per channel, from the partials: sums = [sum g (C), sum g*y (C), n * s] (the
// BatchNorm sums, before any all-reduce) and the Scale's local gradient
// dgamma[c] (+)= sum g*y, dbeta[c] (+)= sum g (dparams = [dgamma (C), dbeta (C) if has_beta]).
extern "C" __global__ void bn_scale_relu_finish(const double* partial, double* sums,
                                                float* dparams, int has_beta, int c, int splits,
                                                int per, int accumulate) {
    WARP_PER_CHANNEL(ch, c) {
        double s1, s2;
        if (!bn_store_sums(partial, sums, ch, c, splits, per, &s1, &s2)) continue;
        dparams[ch] = accumulate ? dparams[ch] + (float)s2 : (float)s2;
        if (has_beta) dparams[c + ch] = accumulate ? dparams[c + ch] + (float)s1 : (float)s1;
    }
}

// dx (+)= BatchNorm's backward of dy = gamma * g: with batch statistics
// (dy - gamma * sums[c] / m - gamma * sums[C + c] / m * y) * inv_std (m = sums[2C]), with global
// ones dy * inv_std.
extern "C" __global__ void bn_scale_relu_backward(const float* dz, const float* z, const float* x,
                                                  const float* mean, const float* inv_std,
                                                  const float* gamma, const double* sums,
                                                  int batch_stats, int relu, float slope,
                                                  float* dx, int n, int c, int s,
                                                  int accumulate) {
    const FastDiv by_s = fast_div(s), by_c = fast_div(c);
    const double inv_m = batch_stats ? 1.0 / sums[2 * c] : 0.0;
    GRID_STRIDE_INT(i, n) {
        const int ch = channel_of(i, by_s, by_c);
        const float gm = gamma[ch];
        const float dy = gm * bsr_grad(dz[i], z[i], relu, slope);
        float d;
        if (batch_stats) {
            const float mean_dy = gm * (float)(sums[ch] * inv_m);
            const float mean_dyy = gm * (float)(sums[c + ch] * inv_m);
            const float y = (x[i] - mean[ch]) * inv_std[ch];
            d = (dy - mean_dy - mean_dyy * y) * inv_std[ch];
        } else {
            d = dy * inv_std[ch];
        }
        dx[i] = accumulate ? dx[i] + d : d;
    }
}

// ---------------------------------------------------------------------------------------------
// Eltwise SUM of two bottoms fused with the ReLU after it (a residual block's join):
// y = relu(c0 * x0 + c1 * x1), the sum rounded as the unfused layers do (c0 * x0, then + c1 * x1).

extern "C" __global__ void sum2_relu_forward(const float* x0, const float* x1, float c0, float c1,
                                             float slope, float* y, int n) {
    GRID_STRIDE_INT(i, n) {
        const float v = fmaf(c1, x1[i], c0 * x0[i]);
        y[i] = v > 0.0f ? v : slope * v;
    }
}

// g = dy * relu'(y) (y > 0 exactly where the sum is, for slope >= 0); dx_k (+)= c_k * g for each
// bottom k that wants its gradient (want_k).
extern "C" __global__ void sum2_relu_backward(const float* y, const float* dy, float c0, float c1,
                                              float slope, float* dx0, float* dx1, int want0,
                                              int want1, int acc0, int acc1, int n) {
    GRID_STRIDE_INT(i, n) {
        const float g = y[i] > 0.0f ? dy[i] : slope * dy[i];
        if (want0) {
            const float v = c0 * g;
            dx0[i] = acc0 ? dx0[i] + v : v;
        }
        if (want1) {
            const float v = c1 * g;
            dx1[i] = acc1 ? dx1[i] + v : v;
        }
    }
}
