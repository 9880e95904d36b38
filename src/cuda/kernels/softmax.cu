// ---------------------------------------------------------------------------------------------
// Softmax over the channel axis of (outer, channels, inner): one thread per (outer, inner).

extern "C" __global__ void softmax_forward(const float* x, float* y, int outer, int channels,
                                           int inner) {
    GRID_STRIDE_INT(t, outer * inner) {
        const int o = t / inner;
        const int i = t - o * inner;
        const float* xs = x + o * channels * inner + i;
        float* ys = y + o * channels * inner + i;
        float m = neg_infinity();
        for (int c = 0; c < channels; ++c) m = fmaxf(m, xs[c * inner]);
        float sum = 0.0f;
        for (int c = 0; c < channels; ++c) {
            const float e = expf(xs[c * inner] - m);
            ys[c * inner] = e;
            sum += e;
        }
        for (int c = 0; c < channels; ++c) ys[c * inner] = ys[c * inner] / sum;
    }
}

// dx (+)= (dy - sum_c dy * y) * y
extern "C" __global__ void softmax_backward(const float* y, const float* dy, float* dx,
                                            int outer, int channels, int inner, int accumulate) {
    GRID_STRIDE_INT(t, outer * inner) {
        const int o = t / inner;
        const int i = t - o * inner;
        const int base = o * channels * inner + i;
        float dot = 0.0f;
        for (int c = 0; c < channels; ++c) dot += dy[base + c * inner] * y[base + c * inner];
        for (int c = 0; c < channels; ++c) {
            const int k = base + c * inner;
            const float g = (dy[k] - dot) * y[k];
            dx[k] = accumulate ? dx[k] + g : g;
        }
    }
}
