// ---------------------------------------------------------------------------------------------
// The labels of the loss and accuracy kernels.

// The class of a label, or -1 when it is `ignore` (if `has_ignore`) or not an integer in
// [0, classes). The CPU layers panic on the latter; here such a sample is skipped.
__device__ __forceinline__ int class_of(float label, int classes, int has_ignore, float ignore) {
    if (has_ignore && label == ignore) return -1;
    if (!(label >= 0.0f) || label != truncf(label) || label >= (float)classes) return -1;
    return (int)label;
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
// Euclidean loss.

// y (+)= (sign * top_diff[0] / num) * x: a bottom's gradient, scaled by the loss weight the net
// put in the top's diff, read on the device.
extern "C" __global__ void scaled_by_top_diff(const float* x, const float* top_diff, float* y,
                                              float sign, float num, int n, int accumulate) {
    const float alpha = sign * top_diff[0] / num;
    GRID_STRIDE_INT(i, n) {
        const float v = alpha * x[i];
        y[i] = accumulate ? y[i] + v : v;
    }
}

// ---------------------------------------------------------------------------------------------
// ArgMax. Search r of `rows` reads dim values `stride` apart from
// (r / stride) * dim * stride + r % stride. Value j's rank is the number of values ranking
// above it (larger; equal at a larger index; a NaN above every number), a permutation of
// 0..dim; one thread per value writes it when its rank is below top_k.

__device__ __forceinline__ bool ranks_above(float a, int i, float b, int j) {
    const bool na = isnan(a), nb = isnan(b);
    if (na != nb) return na;
    if (na) return i > j;
    return a > b || (a == b && i > j);
}

// Without axis (has_axis 0) and with out_max_val: y[2 r top_k + k] = index and
// y[2 r top_k + top_k + k] = value; otherwise y[((r / stride) top_k + k) stride + r % stride] =
// the value (out_max_val) or the index.
extern "C" __global__ void argmax_rank(const float* x, float* y, int rows, int dim, int stride,
                                       int top_k, int out_max_val, int has_axis) {
    GRID_STRIDE_INT(t, rows * dim) {
        const int r = t / dim;
        const int j = t - r * dim;
        const long long first = (long long)(r / stride) * dim * stride + r % stride;
        const float v = x[first + (long long)j * stride];
        int rank = 0;
        for (int q = 0; q < dim; ++q)
            rank += ranks_above(x[first + (long long)q * stride], q, v, j) ? 1 : 0;
        if (rank >= top_k) continue;
        if (out_max_val && !has_axis) {
            y[2LL * r * top_k + rank] = (float)j;
            y[2LL * r * top_k + top_k + rank] = v;
        } else {
            const long long at = ((long long)(r / stride) * top_k + rank) * stride + r % stride;
            y[at] = out_max_val ? v : (float)j;
        }
    }
}
