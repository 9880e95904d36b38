// ---------------------------------------------------------------------------------------------
// Dropout: the counter-based hash of crate::layers::dropout (the layer contract), bit for bit.

__device__ __forceinline__ float dropout_uniform(unsigned long long seed, unsigned long long iter,
                                                 unsigned long long sample,
                                                 unsigned long long elem) {
    unsigned long long z = seed ^ (iter * 0x9E3779B97F4A7C15ull) ^
                           (sample * 0xC2B2AE3D27D4EB4Full) ^ (elem * 0x165667B19E3779F9ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

// The contract's element number of position i of a batch of `per_sample`-element samples: its
// sample s and its index e within the sample in NCHW order. A channels-last sample (chans > 0:
// pixels of `chans` channels) numbers its elements as the NCHW one would, so the mask is the same
// in either layout.
__device__ __forceinline__ void dropout_element(int i, int per_sample, int chans, int* s, int* e) {
    *s = i / per_sample;
    *e = i - *s * per_sample;
    if (chans > 0) {
        const int pixel = *e / chans;
        *e = (*e - pixel * chans) * (per_sample / chans) + pixel;
    }
}

// y = x * (u >= ratio ? scale : 0), element e of sample n at stream position first_sample + n
// (the CPU's product with its mask, so even the sign of a dropped zero agrees).
extern "C" __global__ void dropout_forward(const float* x, float* y, int n, int per_sample,
                                           int chans, unsigned long long seed,
                                           unsigned long long iter,
                                           unsigned long long first_sample, float ratio,
                                           float scale) {
    GRID_STRIDE_INT(i, n) {
        int s, e;
        dropout_element(i, per_sample, chans, &s, &e);
        const float u = dropout_uniform(seed, iter, first_sample + (unsigned long long)s,
                                        (unsigned long long)e);
        y[i] = x[i] * (u >= ratio ? scale : 0.0f);
    }
}

// dx (+)= dy * (u >= ratio ? scale : 0), the forward's mask recomputed.
extern "C" __global__ void dropout_backward(const float* dy, float* dx, int n, int per_sample,
                                            int chans, unsigned long long seed,
                                            unsigned long long iter,
                                            unsigned long long first_sample, float ratio,
                                            float scale, int accumulate) {
    GRID_STRIDE_INT(i, n) {
        int s, e;
        dropout_element(i, per_sample, chans, &s, &e);
        const float u = dropout_uniform(seed, iter, first_sample + (unsigned long long)s,
                                        (unsigned long long)e);
        const float g = dy[i] * (u >= ratio ? scale : 0.0f);
        dx[i] = accumulate ? dx[i] + g : g;
    }
}
