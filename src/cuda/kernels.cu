// The CUDA kernels of p2ptrain's GPU backend, compiled at run time by NVRTC (src/cuda/kernels.rs
// embeds this file). Every kernel is `extern "C"` so that the host loads it by its plain name.
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

// The class of a label, or -1 when it is `ignore` (if `has_ignore`) or not an integer in
// [0, classes). The CPU layers panic on the latter; here such a sample is skipped.
__device__ __forceinline__ int class_of(float label, int classes, int has_ignore, float ignore) {
    if (has_ignore && label == ignore) return -1;
    if (!(label >= 0.0f) || label != truncf(label) || label >= (float)classes) return -1;
    return (int)label;
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
// Vector helpers over (n) floats.

extern "C" __global__ void fill(float* x, float value, long long n) {
    GRID_STRIDE_LONG(i, n) x[i] = value;
}

extern "C" __global__ void scale(float* x, float alpha, long long n) {
    GRID_STRIDE_LONG(i, n) x[i] = alpha * x[i];
}

// y += alpha * x
extern "C" __global__ void axpy(const float* x, float* y, float alpha, long long n) {
    GRID_STRIDE_LONG(i, n) y[i] = y[i] + alpha * x[i];
}

// ---------------------------------------------------------------------------------------------
// Activations over (n) floats: forward y = f(x), backward dx (+)= dy * f'(.).

extern "C" __global__ void relu_forward(const float* x, float* y, float slope, int n) {
    GRID_STRIDE_INT(i, n) {
        const float v = x[i];
        y[i] = v > 0.0f ? v : slope * v;
    }
}

extern "C" __global__ void relu_backward(const float* x, const float* dy, float* dx, float slope,
                                         int n, int accumulate) {
    GRID_STRIDE_INT(i, n) {
        const float g = x[i] > 0.0f ? dy[i] : slope * dy[i];
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

extern "C" __global__ void sigmoid_forward(const float* x, float* y, int n) {
    GRID_STRIDE_INT(i, n) y[i] = 1.0f / (1.0f + expf(-x[i]));
}

// From the top's data y: dx (+)= dy * y * (1 - y).
extern "C" __global__ void sigmoid_backward(const float* y, const float* dy, float* dx, int n,
                                            int accumulate) {
    GRID_STRIDE_INT(i, n) {
        const float v = y[i];
        const float g = dy[i] * v * (1.0f - v);
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

extern "C" __global__ void tanh_forward(const float* x, float* y, int n) {
    GRID_STRIDE_INT(i, n) y[i] = tanhf(x[i]);
}

// From the top's data y: dx (+)= dy * (1 - y^2).
extern "C" __global__ void tanh_backward(const float* y, const float* dy, float* dx, int n,
                                         int accumulate) {
    GRID_STRIDE_INT(i, n) {
        const float v = y[i];
        const float g = dy[i] * (1.0f - v * v);
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

// y (rows, cols) += b (cols) broadcast over the rows.
extern "C" __global__ void bias_add(float* y, const float* b, int rows, int cols) {
    GRID_STRIDE_INT(i, rows * cols) y[i] = y[i] + b[i % cols];
}

// ---------------------------------------------------------------------------------------------
// Softmax with loss. One warp per row of the scores (rows, classes).

// prob (rows, classes) = softmax of each row (max subtracted); per row the loss
// -ln max(p[label], F32_MIN_POSITIVE) in double and whether the row counts (1) or not (0).
extern "C" __global__ void softmax_loss_forward(const float* x, const float* labels, float* prob,
                                                double* row_loss, float* row_valid, int rows,
                                                int classes, int has_ignore, float ignore) {
    const int lane = threadIdx.x & 31;
    const int warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < rows; row += gridDim.x * warps) {
        const float* xr = x + (long long)row * classes;
        float* pr = prob + (long long)row * classes;
        float m = neg_infinity();
        for (int c = lane; c < classes; c += 32) m = fmaxf(m, xr[c]);
        m = warp_max(m);
        float s = 0.0f;
        for (int c = lane; c < classes; c += 32) {
            const float e = expf(xr[c] - m);
            pr[c] = e;
            s += e;
        }
        s = warp_sum(s);
        const float inv = 1.0f / s;
        for (int c = lane; c < classes; c += 32) pr[c] = pr[c] * inv;
        if (lane == 0) {
            const int l = class_of(labels[row], classes, has_ignore, ignore);
            if (l >= 0) {
                // The same operations as pr[l] above, so the same value, without a
                // cross-lane read.
                const float p = expf(xr[l] - m) * inv;
                row_loss[row] = -log((double)fmaxf(p, F32_MIN_POSITIVE));
                row_valid[row] = 1.0f;
            } else {
                row_loss[row] = 0.0;
                row_valid[row] = 0.0f;
            }
        }
    }
}

// One block: loss[0] = sum(row_loss) / max(V, 1) and valid[0] = V = sum(row_valid).
extern "C" __global__ void loss_finalize(const double* row_loss, const float* row_valid, int rows,
                                         float* loss, float* valid) {
    double l = 0.0;
    double v = 0.0;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) {
        l += row_loss[i];
        v += (double)row_valid[i];
    }
    l = block_sum(l);
    v = block_sum(v);
    if (threadIdx.x == 0) {
        loss[0] = (float)(l / (v < 1.0 ? 1.0 : v));
        valid[0] = (float)v;
    }
}

// dx (+)= w / max(V, 1) * (p - onehot(label)) on counted rows, w = top_diff[0] (the loss
// weight), V = valid[0]; rows that do not count get nothing.
extern "C" __global__ void softmax_loss_backward(const float* prob, const float* labels,
                                                 const float* top_diff, const float* valid,
                                                 float* dx, int rows, int classes, int has_ignore,
                                                 float ignore, int accumulate) {
    const float scale = top_diff[0] / fmaxf(valid[0], 1.0f);
    GRID_STRIDE_INT(i, rows * classes) {
        const int row = i / classes;
        const int c = i - row * classes;
        const int l = class_of(labels[row], classes, has_ignore, ignore);
        float d = accumulate ? dx[i] : 0.0f;
        if (l >= 0) {
            d = d + scale * prob[i];
            if (c == l) d = d - scale;
        }
        dx[i] = d;
    }
}

// ---------------------------------------------------------------------------------------------
// Accuracy. One warp per row: a row is correct when fewer than top_k classes score strictly
// higher than its label; rows whose label is ignored (or not a class) are never correct. A NaN
// score ranks above every score, so a row whose label scores NaN is never correct.

extern "C" __global__ void accuracy_rows(const float* x, const float* labels, float* row_correct,
                                         int rows, int classes, int top_k, int has_ignore,
                                         float ignore) {
    const int lane = threadIdx.x & 31;
    const int warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < rows; row += gridDim.x * warps) {
        const int l = class_of(labels[row], classes, has_ignore, ignore);
        if (l < 0) {
            if (lane == 0) row_correct[row] = 0.0f;
            continue;
        }
        const float* xr = x + (long long)row * classes;
        const float score = xr[l];
        int better = 0;
        for (int c = lane; c < classes; c += 32)
            better += (xr[c] > score || isnan(xr[c])) ? 1 : 0;
        better = warp_sum_int(better);
        if (lane == 0) row_correct[row] = (better < top_k && !isnan(score)) ? 1.0f : 0.0f;
    }
}

// One block: out[0] = correct / rows as f32 division of exact counts (the CPU's formula).
extern "C" __global__ void accuracy_finalize(const float* row_correct, int rows, float* out) {
    double c = 0.0;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) c += (double)row_correct[i];
    c = block_sum(c);
    if (threadIdx.x == 0) out[0] = rows == 0 ? 0.0f : (float)c / (float)rows;
}

// ---------------------------------------------------------------------------------------------
// Scalars kept on the device between host synchronisations.

// dst[0] = (reset ? 0 : dst[0]) + weight * src[0]: the summed weighted loss of a pass.
extern "C" __global__ void weighted_sum(const float* src, float weight, float* dst, int reset) {
    if (blockIdx.x == 0 && threadIdx.x == 0) dst[0] = (reset ? 0.0f : dst[0]) + weight * src[0];
}

// slots[slot] = (reset ? 0 : slots[slot]) + loss[0]: one iteration's entry of the loss window.
extern "C" __global__ void loss_slot(const float* loss, double* slots, int slot, int reset) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
        slots[slot] = (reset ? 0.0 : slots[slot]) + (double)loss[0];
}

// diff_at[0] = NaN where loss[0] (an iteration's summed loss) is not finite: a replica's
// non-finite loss reaches every replica through the gradient all-reduce.
extern "C" __global__ void poison_gradient(const double* loss, float* diff_at) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && !isfinite(loss[0]))
        diff_at[0] = __int_as_float(0x7fc00000);
}

// ---------------------------------------------------------------------------------------------
// Gradient clipping: the squared L2 norm of the whole gradient, then the update's scale factor,
// both on the device. A gradient whose sum of squares is not finite (a NaN or an infinity in it)
// is recorded in steps = [count, first, last] and gets a NaN scale, on which the update kernels
// apply nothing; with latch, so does every later one.

// partials[block] = sum of x[i]^2 over the block's grid-stride share, in double.
extern "C" __global__ void sumsq_partial(const float* x, long long n, double* partials) {
    double s = 0.0;
    GRID_STRIDE_LONG(i, n) {
        const double v = (double)x[i];
        s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block: scale[0] = normalise, times clip / norm when parts > 0 and
// norm = sqrt(sum(partials)) * normalise exceeds clip (the CPU solver's steps 1 and 2).
extern "C" __global__ void clip_scale(const double* partials, int parts, double normalise,
                                      double clip, float* scale, long long* steps,
                                      long long iter, int latch) {
    double s = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += partials[i];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        const bool finite = isfinite(s);
        if (!finite) {
            steps[0] += 1;
            if (steps[1] < 0) steps[1] = iter;
            steps[2] = iter;
        }
        if (!finite || (latch && steps[0] > 0)) {
            scale[0] = __int_as_float(0x7fc00000);
            return;
        }
        double factor = normalise;
        if (parts > 0 && clip > 0.0) {
            const double norm = sqrt(s) * normalise;
            if (norm > clip) factor *= clip / norm;
        }
        scale[0] = (float)factor;
    }
}

// ---------------------------------------------------------------------------------------------
// Update rules over the flat buffers w, g (n) and their history, tensor by tensor: tensor s
// holds the elements [ends[s-1], ends[s]) (ends ascending, the last equal to n) and has its
// own lr_mult and decay_mult. Per element, as the CPU solver: the effective gradient
// grad = scale * g + weight_decay * decay_mult * r(w), r(w) = w (L2) or sign(w) (L1), is stored
// back into g, then the rule updates the history and w with lr * lr_mult.

// The first s with i < ends[s].
__device__ __forceinline__ int span_of(long long i, const long long* ends, int spans) {
    int lo = 0;
    int hi = spans - 1;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (i < ends[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

struct SgdRule {
    float momentum;
    float* v;
    __device__ float operator()(long long i, float w, float grad, float lr) const {
        const float next = momentum * v[i] + lr * grad;
        v[i] = next;
        return w - next;
    }
};

struct NesterovRule {
    float momentum;
    float* v;
    __device__ float operator()(long long i, float w, float grad, float lr) const {
        const float prev = v[i];
        const float next = momentum * prev + lr * grad;
        v[i] = next;
        return w - ((1.0f + momentum) * next - momentum * prev);
    }
};

struct AdagradRule {
    float delta;
    float* h;
    __device__ float operator()(long long i, float w, float grad, float lr) const {
        const float hi = h[i] + grad * grad;
        h[i] = hi;
        return w - lr * grad / (sqrtf(hi) + delta);
    }
};

struct RmspropRule {
    float rho;
    float delta;
    float* h;
    __device__ float operator()(long long i, float w, float grad, float lr) const {
        const float hi = rho * h[i] + (1.0f - rho) * grad * grad;
        h[i] = hi;
        return w - lr * grad / (sqrtf(hi) + delta);
    }
};

struct AdamRule {
    float beta1;
    float beta2;
    float eps;
    // sqrt(1 - beta2^t) / (1 - beta1^t)
    float correction;
    float* m;
    float* v;
    __device__ float operator()(long long i, float w, float grad, float lr) const {
        const float step = lr * correction;
        const float mi = beta1 * m[i] + (1.0f - beta1) * grad;
        const float vi = beta2 * v[i] + (1.0f - beta2) * grad * grad;
        m[i] = mi;
        v[i] = vi;
        return w - step * mi / (sqrtf(vi) + eps);
    }
};

template <typename Rule>
__device__ void update(const Rule& rule, float* w, float* g, long long n, const long long* ends,
                       const float* lr_mult, const float* decay_mult, int spans,
                       const float* scale, float lr, float weight_decay, int l1) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    if (i >= n) return;
    const float sc = scale[0];
    if (isnan(sc)) return;  // a step refused for a non-finite gradient
    int s = span_of(i, ends, spans);
    for (; i < n; i += stride) {
        while (i >= ends[s]) ++s;
        const float lr_s = lr * lr_mult[s];
        const float decay_s = weight_decay * decay_mult[s];
        const float wi = w[i];
        const float r = l1 ? (float)((wi > 0.0f) - (wi < 0.0f)) : wi;
        const float grad = sc * g[i] + decay_s * r;
        g[i] = grad;
        w[i] = rule(i, wi, grad, lr_s);
    }
}

#define UPDATE_PARAMS                                                                             \
    float *w, float *g, long long n, const long long *ends, const float *lr_mult,                \
        const float *decay_mult, int spans, const float *scale, float lr, float weight_decay,    \
        int l1
#define UPDATE_ARGS w, g, n, ends, lr_mult, decay_mult, spans, scale, lr, weight_decay, l1

extern "C" __global__ void sgd_update(UPDATE_PARAMS, float* v, float momentum) {
    update(SgdRule{momentum, v}, UPDATE_ARGS);
}

extern "C" __global__ void nesterov_update(UPDATE_PARAMS, float* v, float momentum) {
    update(NesterovRule{momentum, v}, UPDATE_ARGS);
}

extern "C" __global__ void adagrad_update(UPDATE_PARAMS, float* h, float delta) {
    update(AdagradRule{delta, h}, UPDATE_ARGS);
}

extern "C" __global__ void rmsprop_update(UPDATE_PARAMS, float* h, float rho, float delta) {
    update(RmspropRule{rho, delta, h}, UPDATE_ARGS);
}

extern "C" __global__ void adam_update(UPDATE_PARAMS, float* m, float* v, float beta1,
                                       float beta2, float eps, float correction) {
    update(AdamRule{beta1, beta2, eps, correction, m, v}, UPDATE_ARGS);
}
