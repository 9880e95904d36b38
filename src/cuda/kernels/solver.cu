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

// The same over the gradient as the bfloat16 wire leaves it: x = float(w[i]) * scale, the
// widening and the product of from_bf16_scaled, squared in double.
extern "C" __global__ void sumsq_partial_bf16(const unsigned short* w, float scale, long long n,
                                              double* partials) {
    double s = 0.0;
    GRID_STRIDE_LONG(i, n) {
        const float x = __uint_as_float((unsigned int)w[i] << 16) * scale;
        const double v = (double)x;
        s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block: scale[0] = normalise, times clip / norm when parts > 0 and
// norm = sqrt(sum(partials)) * normalise exceeds clip (the CPU solver's steps 1 and 2).
//
// Loss scaling (crate::solver::loss_scale, rule 0 off, 1 fixed, 2 dynamic): the gradient summed
// in partials is ls[0] times the true one. Its verdict, as LossScaler::verdict: not finite under
// the dynamic rule with ls[0] above 1, the step is skipped (scale[0] NaN, not recorded as a
// refused step), ls[0] backs off (at least 1), counts[0] (good steps) restarts and counts[1]
// (skipped steps) grows; finite, counts[0] grows and at growth_interval ls[0] doubles (while
// finite). A finite step is unscaled: the norm is that of the gradient divided by the step's
// scale, and scale[0] carries 1 / scale (for a power of two, the CPU's unscale-then-scale bit for
// bit). Otherwise a non-finite sum is a refused step, as without scaling.
//
// A gradient judged in parts (part > 0 for every part after an iteration's first; the dynamic
// rule is never judged in parts) records its iteration once: a part of an iteration already
// recorded adds nothing to the record, and with latch its scale is NaN like the first one's.
extern "C" __global__ void clip_scale(const double* partials, int parts, double normalise,
                                      double clip, float* scale, long long* steps,
                                      long long iter, int latch, float* ls, long long* counts,
                                      int rule, long long growth_interval, float backoff,
                                      int part) {
    double s = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += partials[i];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        const bool finite = isfinite(s);
        float unscale = 1.0f;
        if (rule != 0) {
            const float step_scale = ls[0];
            if (rule == 2 && !finite && step_scale > 1.0f) {
                ls[0] = fmaxf(step_scale * backoff, 1.0f);
                counts[0] = 0;
                counts[1] += 1;
                scale[0] = __int_as_float(0x7fc00000);
                return;
            }
            if (rule == 2 && finite && ++counts[0] >= growth_interval) {
                counts[0] = 0;
                if (isfinite(step_scale * 2.0f)) ls[0] = step_scale * 2.0f;
            }
            unscale = 1.0f / step_scale;
            s *= (double)unscale * (double)unscale;
        }
        if (!finite && !(part > 0 && steps[2] == iter)) {
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
        scale[0] = (float)((double)(float)factor * (double)unscale);
    }
}

// ---------------------------------------------------------------------------------------------
// Update rules over the elements [start, end) of the flat buffers w, g and their history (the
// whole buffer, or one gradient bucket's part of it), tensor by tensor: tensor s
// holds the elements [ends[s-1], ends[s]) (ends ascending, the last equal to n) and has its
// own lr_mult and decay_mult. The raw gradient is g[i], or, where sum is not null, the bfloat16
// wire's sum float(sum[i]) * sum_scale (from_bf16_scaled's value, which is then never written
// out). Per element, as the CPU solver: the effective gradient
// grad = scale * g + weight_decay * decay_mult * r(w), r(w) = w (L2) or sign(w) (L1), is stored
// back into g (not by a lean update, below), then the rule updates the history and w with
// lr * lr_mult. A rule with decoupled decay (AdamW) gets grad = scale * g and the decay as its
// own term instead.

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

// Each rule reads its history of element i in load(i) (what it does not keep is left 0) and,
// given it, moves the history and returns the new weight in operator(), so that the update can
// issue several elements' reads before it computes any of them.
struct History {
    float a;
    float b;
};

struct SgdRule {
    float momentum;
    float* v;
    __device__ History load(long long i) const { return {v[i], 0.0f}; }
    __device__ float operator()(long long i, History h, float w, float grad, float lr) const {
        const float next = momentum * h.a + lr * grad;
        v[i] = next;
        return w - next;
    }
};

struct NesterovRule {
    float momentum;
    float* v;
    __device__ History load(long long i) const { return {v[i], 0.0f}; }
    __device__ float operator()(long long i, History h, float w, float grad, float lr) const {
        const float prev = h.a;
        const float next = momentum * prev + lr * grad;
        v[i] = next;
        return w - ((1.0f + momentum) * next - momentum * prev);
    }
};

struct AdagradRule {
    float delta;
    float* h;
    __device__ History load(long long i) const { return {h[i], 0.0f}; }
    __device__ float operator()(long long i, History old, float w, float grad, float lr) const {
        const float hi = old.a + grad * grad;
        h[i] = hi;
        return w - lr * grad / (sqrtf(hi) + delta);
    }
};

struct RmspropRule {
    float rho;
    float delta;
    float* h;
    __device__ History load(long long i) const { return {h[i], 0.0f}; }
    __device__ float operator()(long long i, History old, float w, float grad, float lr) const {
        const float hi = rho * old.a + (1.0f - rho) * grad * grad;
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
    __device__ History load(long long i) const { return {m[i], v[i]}; }
    // Moves the moments m[i], v[i] (old: their values) by grad and returns the step
    // lr*correction*m/(sqrt(v) + eps).
    __device__ float step(long long i, History old, float grad, float lr) const {
        const float scaled = lr * correction;
        const float mi = beta1 * old.a + (1.0f - beta1) * grad;
        const float vi = beta2 * old.b + (1.0f - beta2) * grad * grad;
        m[i] = mi;
        v[i] = vi;
        return scaled * mi / (sqrtf(vi) + eps);
    }
    __device__ float operator()(long long i, History old, float w, float grad, float lr) const {
        return w - step(i, old, grad, lr);
    }
};

// AdaDelta as in Caffe, with decay rho (momentum): h <- rho*h + (1-rho)*g^2,
// step = g*sqrt(u + delta)/sqrt(h + delta), u <- rho*u + (1-rho)*step^2, w <- w - lr*step.
struct AdadeltaRule {
    float rho;
    float delta;
    float* h;
    float* u;
    __device__ History load(long long i) const { return {h[i], u[i]}; }
    __device__ float operator()(long long i, History old, float w, float grad, float lr) const {
        const float hi = rho * old.a + (1.0f - rho) * grad * grad;
        h[i] = hi;
        const float step = grad * sqrtf(old.b + delta) / sqrtf(hi + delta);
        u[i] = rho * old.b + (1.0f - rho) * step * step;
        return w - lr * step;
    }
};

// AdamW: Adam's moments of the gradient without the decay, and the decay applied to the weight,
// shrink = lr * weight_decay * decay_mult * r(w) with w taken before the step.
struct AdamwRule {
    AdamRule adam;
    __device__ History load(long long i) const { return adam.load(i); }
    __device__ float operator()(long long i, History old, float w, float grad, float lr,
                                float shrink) const {
        return w - (shrink + adam.step(i, old, grad, lr));
    }
};

// Whether a rule applies the weight decay to the weight itself (decoupled, AdamW) rather than
// through the gradient; such a rule takes the decay term as a fifth argument.
template <typename Rule> struct DecoupledDecay { static constexpr bool value = false; };
template <> struct DecoupledDecay<AdamwRule> { static constexpr bool value = true; };

// The copies of the weights mixed precision's layers see, written by the update from the new
// weight where copy_kind (spans) is not null: per tensor, WEIGHT_ROUNDED writes rounded[i] (the
// weight rounded to the half type, fp16 or bf16), WEIGHT_HALF writes half[i] (its bit pattern),
// WEIGHT_KEPT neither (a stateful layer's tensors, copied before each forward pass instead).
#define WEIGHT_KEPT 0
#define WEIGHT_ROUNDED 1
#define WEIGHT_HALF 2

// How many of a thread's elements the update reads before it computes them: the loads of all
// of them are in flight together (the update streams three to five arrays).
#define UPDATE_ELEMENTS_IN_FLIGHT 4

// Records iteration iter as refused in steps = [count, first, last] (as clip_scale does) from
// any number of threads at once: the thread that moves last to iter counts it.
__device__ void refuse_step(long long* steps, long long iter) {
    unsigned long long* record = (unsigned long long*)steps;
    if ((long long)atomicExch(record + 2, (unsigned long long)iter) == iter) return;
    atomicAdd(record, 1ull);
    atomicCAS(record + 1, (unsigned long long)-1LL, (unsigned long long)iter);
}

// A lean update (steps not null: a part of an update that runs bucket by bucket, under the
// stop rule, with neither clipping nor a dynamic loss scale) judges each raw gradient element
// itself instead of a sum of squares before it: a non-finite one records iteration iter in
// steps and leaves its element as it was (the latch then refuses every later part and step);
// and it does not store the effective gradient back into g.
template <typename Rule>
__device__ void update(const Rule& rule, float* w, float* g, const unsigned short* sum,
                       float sum_scale, long long start, long long end, const long long* ends,
                       const float* lr_mult, const float* decay_mult, int spans,
                       const float* scale, float lr, float weight_decay, int l1, float* rounded,
                       unsigned short* half, const int* copy_kind, int fp16, long long* steps,
                       long long iter) {
    long long i = start + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    if (i >= end) return;
    const float sc = scale[0];
    if (isnan(sc)) return;  // a step refused for a non-finite gradient
    int s = span_of(i, ends, spans);
    // What element k streams in: its weight, its raw gradient and its history.
    struct In {
        float w;
        float g;
        History h;
    };
    const auto load = [&](long long k) {
        const float gk = sum ? __uint_as_float((unsigned int)sum[k] << 16) * sum_scale : g[k];
        return In{w[k], gk, rule.load(k)};
    };
    // Element k from its inputs, k ascending from call to call.
    const auto apply = [&](long long k, In in) {
        while (k >= ends[s]) ++s;
        const float lr_s = lr * lr_mult[s];
        const float decay_s = weight_decay * decay_mult[s];
        const float wi = in.w;
        const float r = l1 ? (float)((wi > 0.0f) - (wi < 0.0f)) : wi;
        if (steps && !isfinite(in.g)) {
            refuse_step(steps, iter);
            return;
        }
        float next;
        if constexpr (DecoupledDecay<Rule>::value) {
            const float grad = sc * in.g;
            if (!steps) g[k] = grad;
            next = rule(k, in.h, wi, grad, lr_s, lr_s * decay_s * r);
        } else {
            const float grad = sc * in.g + decay_s * r;
            if (!steps) g[k] = grad;
            next = rule(k, in.h, wi, grad, lr_s);
        }
        w[k] = next;
        if (copy_kind) {
            const int kind = copy_kind[s];
            if (kind == WEIGHT_ROUNDED) rounded[k] = round_to_half(next, fp16);
            else if (kind == WEIGHT_HALF) half[k] = half_bits(next, fp16);
        }
    };
    constexpr int K = UPDATE_ELEMENTS_IN_FLIGHT;
    for (; i + (K - 1) * stride < end; i += K * stride) {
        In in[K];
#pragma unroll
        for (int u = 0; u < K; ++u) in[u] = load(i + u * stride);
#pragma unroll
        for (int u = 0; u < K; ++u) apply(i + u * stride, in[u]);
    }
    for (; i < end; i += stride) apply(i, load(i));
}

#define UPDATE_PARAMS                                                                       \
    float *w, float *g, const unsigned short *sum, float sum_scale, long long start,         \
        long long end, const long long *ends, const float *lr_mult, const float *decay_mult, \
        int spans, const float *scale, float lr, float weight_decay, int l1, float *rounded,    \
        unsigned short *half, const int *copy_kind, int fp16, long long *steps, long long iter
#define UPDATE_ARGS                                                                            \
    w, g, sum, sum_scale, start, end, ends, lr_mult, decay_mult, spans, scale, lr, weight_decay, \
        l1, rounded, half, copy_kind, fp16, steps, iter

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

extern "C" __global__ void adamw_update(UPDATE_PARAMS, float* m, float* v, float beta1,
                                        float beta2, float eps, float correction) {
    update(AdamwRule{AdamRule{beta1, beta2, eps, correction, m, v}}, UPDATE_ARGS);
}

extern "C" __global__ void adadelta_update(UPDATE_PARAMS, float* h, float* u, float rho,
                                           float delta) {
    update(AdadeltaRule{rho, delta, h, u}, UPDATE_ARGS);
}
