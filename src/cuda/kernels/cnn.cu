
// ---------------------------------------------------------------------------------------------
// The kernels of the convolutional-net layers (src/cuda/kernels/cnn.cu, appended to kernels.cu
// into one NVRTC program; the conventions at the top of kernels.cu hold here too). A 4-D blob is
// stored NCHW or channels-last (NHWC); a "channel view" of a blob is (outer, dim, inner) with the
// channel index (i / inner) % dim: (N, C, H * W) for NCHW, (N * H * W, C, 1) for NHWC, so the
// channel kernels serve both layouts. Channel indices are computed with FastDiv (a multiply-high
// and a shift instead of the ~20 instructions of an integer division, which would otherwise bound
// these memory-bound kernels).

// Division of non-negative ints below 2^31 by a fixed positive divisor d: q = (hi(n * m) + n) >> s
// with s = ceil(log2 d) and m = floor(2^32 * (2^s - d) / d) + 1 (Granlund and Montgomery). Each
// thread builds its divisors once; the grid-stride loops amortise that over many elements.
struct FastDiv {
    unsigned d, m, s;
};

__device__ __forceinline__ FastDiv fast_div(int d) {
    FastDiv f;
    f.d = (unsigned)d;
    f.s = 0;
    while ((1u << f.s) < f.d) ++f.s;
    f.m = (unsigned)(((1ull << 32) * ((1ull << f.s) - f.d)) / f.d + 1);
    return f;
}

__device__ __forceinline__ int div_by(int n, FastDiv f) {
    const unsigned t = __umulhi((unsigned)n, f.m);
    return (int)((t + (unsigned)n) >> f.s);
}

// (i / inner) % dim
__device__ __forceinline__ int channel_of(int i, FastDiv inner, FastDiv dim) {
    const int q = div_by(i, inner);
    return q - div_by(q, dim) * (int)dim.d;
}

// The finishing kernels of the per-channel reductions run one warp per channel: `ch` runs over
// this warp's channels (launched with Kernels::grid_rows).
#define WARP_PER_CHANNEL(ch, c)                                                                   \
    for (int ch = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; ch < (c);                         \
         ch += (gridDim.x * blockDim.x) >> 5)

__device__ __forceinline__ double warp_sum_double(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// The sums over the `splits` chunks of channel ch of the stage-1 partials laid out
// [(ch * splits + k) * pair + j], j < pair (1 or 2): lane l adds chunks l, l + 32, ... in order,
// then a fixed shuffle tree adds the lanes, so the result depends only on the shape. Called by a
// whole warp; valid in every lane.
__device__ __forceinline__ void chunk_sums(const double* partial, int ch, int splits, int pair,
                                           double* s1, double* s2) {
    const int lane = threadIdx.x & 31;
    double a = 0.0, b = 0.0;
    for (int k = lane; k < splits; k += 32) {
        a += partial[(ch * splits + k) * pair];
        if (pair == 2) b += partial[(ch * splits + k) * 2 + 1];
    }
    *s1 = warp_sum_double(a);
    *s2 = warp_sum_double(b);
}

// dst[r * dst_stride + dst_off + c] (+)= src[r * src_stride + src_off + c] for r < rows,
// c < cols: concat, slices and plain copies.
extern "C" __global__ void copy_strided(const float* src, float* dst, int rows, int cols,
                                        int src_stride, int src_off, int dst_stride, int dst_off,
                                        int accumulate) {
    GRID_STRIDE_INT(i, rows * cols) {
        const int r = i / cols;
        const int c = i - r * cols;
        const float v = src[r * src_stride + src_off + c];
        float* d = dst + r * dst_stride + dst_off + c;
        *d = accumulate ? *d + v : v;
    }
}

// dx[p][y][x][i] (+)= t[p][y / sh][x / sw][i] where y and x are multiples of sh and sw within
// the (oh, ow) grid, else (+)= 0, for `planes` planes of (h, w) positions of `inner` values: the
// data gradient of a strided 1 x 1 convolution without padding, from t = W^T dy computed at the
// output positions (NCHW: planes = N * C, inner = 1; NHWC: planes = N, inner = C).
extern "C" __global__ void unstride_planes(const float* t, float* dx, int planes, int oh, int ow,
                                           int h, int w, int sh, int sw, int inner,
                                           int accumulate) {
    GRID_STRIDE_INT(i, planes * h * w * inner) {
        const int e = i % inner;
        const int pixel = i / inner;
        const int plane = pixel / (h * w);
        const int r = pixel - plane * (h * w);
        const int y = r / w;
        const int x = r - y * w;
        const int oy = y / sh, ox = x / sw;
        const bool hit = oy * sh == y && ox * sw == x && oy < oh && ox < ow;
        const float v = hit ? t[((plane * oh + oy) * ow + ox) * inner + e] : 0.0f;
        dx[i] = accumulate ? dx[i] + v : v;
    }
}

// y[b][j][i] (+)= x[b][i][j] for a batch of (rows, cols) matrices: NCHW <-> NHWC (rows = C,
// cols = H * W, or the reverse) and KCRS <-> KRSC filters. A block of 32 x 8 threads moves one
// 32 x 32 tile (blockIdx.x along cols, blockIdx.y along rows, blockIdx.z the matrix) through
// shared memory, so that reads and writes are both whole 128-byte runs.
extern "C" __global__ void transpose_batched(const float* x, float* y, int rows, int cols,
                                             int accumulate) {
    __shared__ float tile[32][33];
    const long long base = (long long)blockIdx.z * rows * cols;
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int dr = threadIdx.y; dr < 32; dr += 8) {
        const int r = r0 + dr, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[dr][threadIdx.x] = x[base + (long long)r * cols + c];
    }
    __syncthreads();
    for (int dc = threadIdx.y; dc < 32; dc += 8) {
        const int c = c0 + dc, r = r0 + threadIdx.x;
        if (r < rows && c < cols) {
            float* out = y + base + (long long)c * rows + r;
            const float v = tile[threadIdx.x][dc];
            *out = accumulate ? *out + v : v;
        }
    }
}

// y (+)= alpha * x
extern "C" __global__ void scaled_copy(const float* x, float* y, float alpha, int n,
                                       int accumulate) {
    GRID_STRIDE_INT(i, n) {
        const float v = alpha * x[i];
        y[i] = accumulate ? y[i] + v : v;
    }
}

// y = a * b
extern "C" __global__ void mul_into(const float* a, const float* b, float* y, int n) {
    GRID_STRIDE_INT(i, n) y[i] = a[i] * b[i];
}

// y *= x
extern "C" __global__ void mul_inplace(float* y, const float* x, int n) {
    GRID_STRIDE_INT(i, n) y[i] = y[i] * x[i];
}

// Eltwise MAX, one bottom at a time: bottom k = 0 initialises; later bottoms replace the
// running maximum only when strictly greater (the first maximum wins).
extern "C" __global__ void eltwise_max_step(const float* x, float* y, int* mask, int k, int n) {
    GRID_STRIDE_INT(i, n) {
        const float v = x[i];
        if (k == 0 || v > y[i]) {
            y[i] = v;
            mask[i] = k;
        }
    }
}

// dx (+)= mask == k ? dy : 0
extern "C" __global__ void eltwise_max_backward(const float* dy, const int* mask, float* dx,
                                                int k, int n, int accumulate) {
    GRID_STRIDE_INT(i, n) {
        const float g = mask[i] == k ? dy[i] : 0.0f;
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

// ---------------------------------------------------------------------------------------------
// Pooling, Caffe's kernels (BVLC pooling_layer.cu) with its output sizes.

struct PoolGeom {
    int channels, height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w,
        pad_h, pad_w, nhwc;
};

// (plane, row, col) of element i of a (planes, rows, cols) tensor; a plane is one (n, c).
__device__ __forceinline__ void plane_pos(int i, FastDiv cols, FastDiv rows, int* plane, int* r,
                                          int* c) {
    const int q = div_by(i, cols);
    *c = i - q * (int)cols.d;
    *plane = div_by(q, rows);
    *r = q - *plane * (int)rows.d;
}

// Row, column, sample and channel of element i of a (N, C, rows, cols) tensor stored NCHW or
// (nhwc) NHWC.
__device__ __forceinline__ void plane_of(int i, FastDiv cols, FastDiv rows, FastDiv chans,
                                         int nhwc, int* r, int* c, int* n, int* ch) {
    if (nhwc) {
        const int q = div_by(i, chans);
        *ch = i - q * (int)chans.d;
        plane_pos(q, cols, rows, n, r, c);
    } else {
        int plane;
        plane_pos(i, cols, rows, &plane, r, c);
        *n = div_by(plane, chans);
        *ch = plane - *n * (int)chans.d;
    }
}

// Where the (n, ch) plane of a tensor of `area` pixels per plane starts: pixel p of the plane is at
// plane_base + p * step, step 1 for NCHW and `channels` for NHWC.
__device__ __forceinline__ int plane_base(int n, int ch, int channels, int area, int nhwc) {
    return nhwc ? n * area * channels + ch : (n * channels + ch) * area;
}

// The first and one-past-last window along an axis covering padded position p (position + pad)
// of the bottom: windows start every `stride` and span `kernel`, `pooled` of them.
__device__ __forceinline__ void covering(int p, int kernel, FastDiv stride, int pooled, int* start,
                                         int* end) {
    *start = (p < kernel) ? 0 : div_by(p - kernel, stride) + 1;
    *end = min(div_by(p, stride) + 1, pooled);
}

// One thread per top element: the maximum of the window clipped to the image, and its index
// h * width + w in the (n, c) plane (the first maximum in row-major order wins). With `relu` (a
// ReLU after the pooling, fused): a maximum that is not positive becomes 0 with index -1, so
// that the backward, which gives each bottom element the top diffs whose index it is, passes no
// gradient through it — the ReLU's derivative.
extern "C" __global__ void max_pool_forward(const float* x, float* y, int* mask, int top_count,
                                            PoolGeom g, int relu) {
    const FastDiv by_pw = fast_div(g.pooled_w), by_ph = fast_div(g.pooled_h);
    const FastDiv by_c = fast_div(g.channels);
    const int step = g.nhwc ? g.channels : 1;
    GRID_STRIDE_INT(index, top_count) {
        int ph, pw, n, ch;
        plane_of(index, by_pw, by_ph, by_c, g.nhwc, &ph, &pw, &n, &ch);
        int hstart = ph * g.stride_h - g.pad_h;
        int wstart = pw * g.stride_w - g.pad_w;
        const int hend = min(hstart + g.kernel_h, g.height);
        const int wend = min(wstart + g.kernel_w, g.width);
        hstart = max(hstart, 0);
        wstart = max(wstart, 0);
        float maxval = -3.402823466e+38f;
        int maxidx = -1;
        const float* slice = x + plane_base(n, ch, g.channels, g.height * g.width, g.nhwc);
        for (int h = hstart; h < hend; ++h) {
            for (int w = wstart; w < wend; ++w) {
                const float v = slice[(h * g.width + w) * step];
                if (v > maxval) {
                    maxidx = h * g.width + w;
                    maxval = v;
                }
            }
        }
        if (relu && !(maxval > 0.0f)) {
            maxval = 0.0f;
            maxidx = -1;
        }
        y[index] = maxval;
        mask[index] = maxidx;
    }
}

// One thread per top element: the window's sum divided by its size clipped to
// [-pad, size + pad) (padding counts, the part beyond the padded image does not). With `relu` (a
// ReLU before the pooling, fused): each value read goes through the ReLU of slope `slope` first.
extern "C" __global__ void ave_pool_forward(const float* x, float* y, int top_count, PoolGeom g,
                                            int relu, float slope) {
    const FastDiv by_pw = fast_div(g.pooled_w), by_ph = fast_div(g.pooled_h);
    const FastDiv by_c = fast_div(g.channels);
    const int step = g.nhwc ? g.channels : 1;
    GRID_STRIDE_INT(index, top_count) {
        int ph, pw, n, ch;
        plane_of(index, by_pw, by_ph, by_c, g.nhwc, &ph, &pw, &n, &ch);
        int hstart = ph * g.stride_h - g.pad_h;
        int wstart = pw * g.stride_w - g.pad_w;
        int hend = min(hstart + g.kernel_h, g.height + g.pad_h);
        int wend = min(wstart + g.kernel_w, g.width + g.pad_w);
        const int pool_size = (hend - hstart) * (wend - wstart);
        hstart = max(hstart, 0);
        wstart = max(wstart, 0);
        hend = min(hend, g.height);
        wend = min(wend, g.width);
        float aveval = 0.0f;
        const float* slice = x + plane_base(n, ch, g.channels, g.height * g.width, g.nhwc);
        for (int h = hstart; h < hend; ++h) {
            for (int w = wstart; w < wend; ++w) {
                const float v = slice[(h * g.width + w) * step];
                aveval += (relu && !(v > 0.0f)) ? slope * v : v;
            }
        }
        y[index] = aveval / pool_size;
    }
}

// One thread per bottom element: the sum of the top diffs whose argmax it is (no atomics).
extern "C" __global__ void max_pool_backward(const float* dy, const int* mask, float* dx,
                                             int bottom_count, PoolGeom g, int accumulate) {
    const FastDiv by_w = fast_div(g.width), by_h = fast_div(g.height);
    const FastDiv by_sh = fast_div(g.stride_h), by_sw = fast_div(g.stride_w);
    const FastDiv by_c = fast_div(g.channels);
    const int step = g.nhwc ? g.channels : 1;
    GRID_STRIDE_INT(index, bottom_count) {
        int h, w, n, ch;
        plane_of(index, by_w, by_h, by_c, g.nhwc, &h, &w, &n, &ch);
        int phstart, phend, pwstart, pwend;
        covering(h + g.pad_h, g.kernel_h, by_sh, g.pooled_h, &phstart, &phend);
        covering(w + g.pad_w, g.kernel_w, by_sw, g.pooled_w, &pwstart, &pwend);
        float gradient = 0.0f;
        const int offset = plane_base(n, ch, g.channels, g.pooled_h * g.pooled_w, g.nhwc);
        const float* dy_slice = dy + offset;
        const int* mask_slice = mask + offset;
        const int self = h * g.width + w;
        for (int ph = phstart; ph < phend; ++ph) {
            for (int pw = pwstart; pw < pwend; ++pw) {
                const int p = (ph * g.pooled_w + pw) * step;
                if (mask_slice[p] == self) gradient += dy_slice[p];
            }
        }
        dx[index] = accumulate ? dx[index] + gradient : gradient;
    }
}

// One thread per bottom element: the sum over the windows covering it of top diff / pool size;
// with `relu` (fused before the pooling), times the ReLU's derivative at the bottom's value x.
extern "C" __global__ void ave_pool_backward(const float* dy, float* dx, int bottom_count,
                                             PoolGeom g, int accumulate, const float* x, int relu,
                                             float slope) {
    const FastDiv by_w = fast_div(g.width), by_h = fast_div(g.height);
    const FastDiv by_sh = fast_div(g.stride_h), by_sw = fast_div(g.stride_w);
    const FastDiv by_c = fast_div(g.channels);
    const int step = g.nhwc ? g.channels : 1;
    GRID_STRIDE_INT(index, bottom_count) {
        int h, w, n, ch;
        plane_of(index, by_w, by_h, by_c, g.nhwc, &h, &w, &n, &ch);
        h += g.pad_h;
        w += g.pad_w;
        int phstart, phend, pwstart, pwend;
        covering(h, g.kernel_h, by_sh, g.pooled_h, &phstart, &phend);
        covering(w, g.kernel_w, by_sw, g.pooled_w, &pwstart, &pwend);
        float gradient = 0.0f;
        const float* dy_slice =
            dy + plane_base(n, ch, g.channels, g.pooled_h * g.pooled_w, g.nhwc);
        for (int ph = phstart; ph < phend; ++ph) {
            const int hstart = ph * g.stride_h - g.pad_h;
            const int hend = min(hstart + g.kernel_h, g.height + g.pad_h);
            for (int pw = pwstart; pw < pwend; ++pw) {
                const int wstart = pw * g.stride_w - g.pad_w;
                const int wend = min(wstart + g.kernel_w, g.width + g.pad_w);
                const int pool_size = (hend - hstart) * (wend - wstart);
                gradient += dy_slice[(ph * g.pooled_w + pw) * step] / pool_size;
            }
        }
        if (relu && !(x[index] > 0.0f)) gradient = slope * gradient;
        dx[index] = accumulate ? dx[index] + gradient : gradient;
    }
}

// Both backward kernels for NCHW planes that fit in shared memory ("plane" kernel): a block takes
// one (n, c) plane at a time (grid-stride over planes), stages the plane's top gradient (and
// argmax) in shared memory and looks up which windows cover each bottom row and column in tables
// built once per block, so that an element costs one division (its row) instead of seven
// (cifar10_quick's max-pooling backward at batch 512: 154 → 91 µs). The same arithmetic, in the
// same order, as the kernels above: the results are bitwise the same. (A forward twin that staged
// the bottom plane was slower than the kernels above, whose window reads hit L1 anyway.)

// Caffe's divisor of an average along one axis for window p: the window clipped to the padded
// image (the part beyond the image but within the padding counts).
__device__ __forceinline__ int window_divisor(int p, int kernel, int stride, int pad, int size) {
    const int lo = p * stride - pad;
    return min(lo + kernel, size + pad) - lo;
}

// Backward table, per bottom row (column): the first and one-past-last window covering it.
__device__ __forceinline__ void cover_table(int size, int kernel, int stride, int pad, int pooled,
                                            int* first, int* last) {
    const FastDiv by_s = fast_div(stride);
    for (int i = threadIdx.x; i < size; i += blockDim.x)
        covering(i + pad, kernel, by_s, pooled, &first[i], &last[i]);
}

// Shared memory: per bottom row and column the covering windows (2 * (height + width) ints), per
// top row and column the average's divisor (pooled_h + pooled_w ints), then the top gradients of
// `per_pass` planes and, for max, their argmaxes (per_pass * pooled_h * pooled_w floats and
// ints). A block takes `per_pass` consecutive planes at a time (grid-stride over such groups):
// consecutive planes lie one after another, so a pass reads and writes contiguous runs, and each
// thread takes PLANE_RUN elements of the pass at once, their loads issued together (one plane
// per pass, one element per thread, left the device waiting on memory latency: cifar10_quick's
// fused ReLU and average pooling, 16 × 16 planes, took 56 µs for 38 MB). An average's top
// gradient is divided by its divisor as it is staged, the same quotient the sum used to compute
// per covering window. `x`, `relu` and `slope` as in ave_pool_backward (averages only).
#define PLANE_RUN 4
extern "C" __global__ void pool_backward_planes(const float* dy, const int* mask, float* dx,
                                                int planes, PoolGeom g, int average,
                                                int accumulate, const float* x, int relu,
                                                float slope, int per_pass) {
    extern __shared__ int smem[];
    int* h_first = smem;
    int* h_last = h_first + g.height;
    int* w_first = h_last + g.height;
    int* w_last = w_first + g.width;
    int* h_div = w_last + g.width;
    int* w_div = h_div + g.pooled_h;
    float* pass_dy = (float*)(w_div + g.pooled_w);
    int* pass_mask = (int*)(pass_dy + per_pass * g.pooled_h * g.pooled_w);
    cover_table(g.height, g.kernel_h, g.stride_h, g.pad_h, g.pooled_h, h_first, h_last);
    cover_table(g.width, g.kernel_w, g.stride_w, g.pad_w, g.pooled_w, w_first, w_last);
    for (int p = threadIdx.x; p < g.pooled_h; p += blockDim.x)
        h_div[p] = window_divisor(p, g.kernel_h, g.stride_h, g.pad_h, g.height);
    for (int p = threadIdx.x; p < g.pooled_w; p += blockDim.x)
        w_div[p] = window_divisor(p, g.kernel_w, g.stride_w, g.pad_w, g.width);
    const int area = g.height * g.width, pooled = g.pooled_h * g.pooled_w;
    const FastDiv by_w = fast_div(g.width), by_area = fast_div(area),
                  by_pooled = fast_div(pooled), by_pw = fast_div(g.pooled_w);
    for (int first = blockIdx.x * per_pass; first < planes; first += gridDim.x * per_pass) {
        const int count = min(per_pass, planes - first);
        __syncthreads();  // the tables written, the previous pass's planes read
        const long long top = (long long)first * pooled;
        for (int t = threadIdx.x; t < count * pooled; t += blockDim.x) {
            if (average) {
                const int p = t - div_by(t, by_pooled) * pooled;
                const int ph = div_by(p, by_pw), pw = p - ph * g.pooled_w;
                pass_dy[t] = dy[top + t] / (h_div[ph] * w_div[pw]);
            } else {
                pass_dy[t] = dy[top + t];
                pass_mask[t] = mask[top + t];
            }
        }
        __syncthreads();
        float* pdx = dx + (long long)first * area;
        const float* px = x + (long long)first * area;
        const int n = count * area;
        for (int t0 = threadIdx.x; t0 < n; t0 += PLANE_RUN * blockDim.x) {
            float below[PLANE_RUN], old[PLANE_RUN];
#pragma unroll
            for (int e = 0; e < PLANE_RUN; ++e) {
                const int t = t0 + e * blockDim.x;
                below[e] = (relu && t < n) ? px[t] : 0.0f;
                old[e] = (accumulate && t < n) ? pdx[t] : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < PLANE_RUN; ++e) {
                const int t = t0 + e * blockDim.x;
                if (t < n) {
                    const int plane = div_by(t, by_area), i = t - plane * area;
                    const int h = div_by(i, by_w), w = i - h * g.width;
                    const float* plane_dy = pass_dy + plane * pooled;
                    const int* plane_mask = pass_mask + plane * pooled;
                    float gradient = 0.0f;
                    for (int ph = h_first[h]; ph < h_last[h]; ++ph) {
                        for (int pw = w_first[w]; pw < w_last[w]; ++pw) {
                            const int p = ph * g.pooled_w + pw;
                            if (average || plane_mask[p] == i) gradient += plane_dy[p];
                        }
                    }
                    if (relu && !(below[e] > 0.0f)) gradient = slope * gradient;
                    pdx[t] = accumulate ? old[e] + gradient : gradient;
                }
            }
        }
    }
}

// Max pooling backward for NCHW planes that fit in shared memory, by top element ("scatter"
// kernel): a block takes one (n, c) plane at a time (grid-stride over planes), stages the plane's
// top gradient and argmax, zeroes the plane's bottom gradient in shared memory and adds each top
// diff at its argmax, in rounds. A top whose window is the (dh, dw)-th of the windows covering
// its argmax pixel (counted from the first, as in the tables above) is added in round
// dh · rounds_w + dw: within a round no two tops share an argmax, and the rounds go in ascending
// (dh, dw), so each pixel sums its windows' diffs in ascending (ph, pw), the order of the kernels
// above — bitwise the same result — with a few instructions per top instead of a covering-window
// loop per bottom element. rounds_h × rounds_w bounds the windows covering one pixel
// (ceil(kernel / stride) per axis). A top without an argmax (-1) adds nothing.
extern "C" __global__ void max_pool_backward_scatter(const float* dy, const int* mask, float* dx,
                                                     int planes, PoolGeom g, int rounds_h,
                                                     int rounds_w, int accumulate) {
    extern __shared__ int smem[];
    const int area = g.height * g.width, pooled = g.pooled_h * g.pooled_w;
    int* h_first = smem;
    int* h_last = h_first + g.height;
    int* w_first = h_last + g.height;
    int* w_last = w_first + g.width;
    int* plane_mask = w_last + g.width;
    int* plane_round = plane_mask + pooled;
    float* plane_dy = (float*)(plane_round + pooled);
    float* plane_dx = plane_dy + pooled;
    cover_table(g.height, g.kernel_h, g.stride_h, g.pad_h, g.pooled_h, h_first, h_last);
    cover_table(g.width, g.kernel_w, g.stride_w, g.pad_w, g.pooled_w, w_first, w_last);
    const FastDiv by_w = fast_div(g.width), by_pw = fast_div(g.pooled_w);
    for (int plane = blockIdx.x; plane < planes; plane += gridDim.x) {
        __syncthreads();  // the tables built; the previous plane written out
        const long long top = (long long)plane * pooled;
        for (int p = threadIdx.x; p < pooled; p += blockDim.x) {
            const int m = mask[top + p];
            plane_mask[p] = m;
            plane_dy[p] = dy[top + p];
            int round = -1;
            if (m >= 0) {
                const int ah = div_by(m, by_w), aw = m - ah * g.width;
                const int ph = div_by(p, by_pw), pw = p - ph * g.pooled_w;
                round = (ph - h_first[ah]) * rounds_w + (pw - w_first[aw]);
            }
            plane_round[p] = round;
        }
        for (int i = threadIdx.x; i < area; i += blockDim.x) plane_dx[i] = 0.0f;
        __syncthreads();
        for (int r = 0; r < rounds_h * rounds_w; ++r) {
            for (int p = threadIdx.x; p < pooled; p += blockDim.x) {
                if (plane_round[p] == r) plane_dx[plane_mask[p]] += plane_dy[p];
            }
            __syncthreads();
        }
        float* pdx = dx + (long long)plane * area;
        for (int i = threadIdx.x; i < area; i += blockDim.x)
            pdx[i] = accumulate ? pdx[i] + plane_dx[i] : plane_dx[i];
    }
}

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

// Stage 1 of one or two sums per channel: term(idx, d) is the (first, second) term of element
// idx of channel d. Writes partial[(d * splits + k) * 2 + {0, 1}] when pair, else only the first
// sum at partial[d * splits + k].
template <class Term>
__device__ __forceinline__ void view_sums(Term term, double* partial, int pair, int outer,
                                          int dim, int inner, int splits) {
    const int k = blockIdx.x;
    double s1 = 0.0, s2 = 0.0;
    int d;
    if (inner == 1) {
        __shared__ double rows[2][SUM_ROWS][SUM_TILE];
        d = blockIdx.y * SUM_TILE + threadIdx.x;
        const int chunk = (outer + splits - 1) / splits;
        const int begin = k * chunk;
        const int end = min(outer, begin + chunk);
        if (d < dim) {
            // Four rows' loads in flight per thread, added in row order as one at a time would.
            int r = begin + threadIdx.y;
            for (; r + 3 * SUM_ROWS < end; r += 4 * SUM_ROWS) {
                double2 t[4];
                for (int u = 0; u < 4; ++u) t[u] = term((r + u * SUM_ROWS) * dim + d, d);
                for (int u = 0; u < 4; ++u) {
                    s1 += t[u].x;
                    s2 += t[u].y;
                }
            }
            for (; r < end; r += SUM_ROWS) {
                const double2 t = term(r * dim + d, d);
                s1 += t.x;
                s2 += t.y;
            }
        }
        rows[0][threadIdx.y][threadIdx.x] = s1;
        rows[1][threadIdx.y][threadIdx.x] = s2;
        __syncthreads();
        if (threadIdx.y != 0 || d >= dim) return;
        s1 = 0.0;
        s2 = 0.0;
        for (int y = 0; y < SUM_ROWS; ++y) {
            s1 += rows[0][y][threadIdx.x];
            s2 += rows[1][y][threadIdx.x];
        }
    } else {
        d = blockIdx.y;
        const int per = outer * inner;
        const int chunk = (per + splits - 1) / splits;
        const int begin = k * chunk;
        const int end = min(per, begin + chunk);
        const FastDiv by_inner = fast_div(inner);
        for (int j = begin + threadIdx.x; j < end; j += blockDim.x) {
            const int o = div_by(j, by_inner);
            const double2 t = term((o * dim + d) * inner + (j - o * inner), d);
            s1 += t.x;
            s2 += t.y;
        }
        s1 = block_sum(s1);
        s2 = pair ? block_sum(s2) : 0.0;
        if (threadIdx.x != 0) return;
    }
    if (pair) {
        partial[(d * splits + k) * 2] = s1;
        partial[(d * splits + k) * 2 + 1] = s2;
    } else {
        partial[d * splits + k] = s1;
    }
}

// partial[d * splits + k] = sum over chunk k of channel d of a * (has_b ? b : 1).
extern "C" __global__ void channel_reduce(const float* a, const float* b, int has_b,
                                          double* partial, int outer, int dim, int inner,
                                          int splits) {
    view_sums(
        [=](int idx, int) {
            return make_double2(has_b ? (double)a[idx] * (double)b[idx] : (double)a[idx], 0.0);
        },
        partial, 0, outer, dim, inner, splits);
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
// BatchNorm over (N, C, S = H * W), statistics in double. sums holds 2C + 1 doubles:
// [sum a (C), sum a*b or a*a (C), count].

// Stage 1 of the sums (see the per-channel reductions above) over the view (n, c, s): over
// chunk k of channel ch, partial[(ch * splits + k) * 2] = sum a,
// partial[... + 1] = sum a * (has_b ? b : a).
extern "C" __global__ void bn_sums(const float* a, const float* b, int has_b, double* partial,
                                   int n, int c, int s, int splits) {
    view_sums(
        [=](int idx, int) {
            const double v = (double)a[idx];
            return make_double2(v, v * (has_b ? (double)b[idx] : v));
        },
        partial, 1, n, c, s, splits);
}

// Per channel c: sums[c] = sum a, sums[C + c] = sum a * (b or a), from the partials;
// sums[2C] = n * s.
extern "C" __global__ void bn_sums_finish(const double* partial, double* sums, int c, int splits,
                                          int per) {
    WARP_PER_CHANNEL(ch, c) {
        double s1, s2;
        chunk_sums(partial, ch, splits, 2, &s1, &s2);
        if ((threadIdx.x & 31) != 0) continue;
        sums[ch] = s1;
        sums[c + ch] = s2;
        if (ch == 0) sums[2 * c] = (double)per;
    }
}

// Batch statistics from the sums of x and x^2 over m = sums[2C] values: mean, biased variance,
// inv_std = 1 / sqrt(var + eps).
extern "C" __global__ void bn_batch_stats(const double* sums, int c, float eps, float* mean,
                                          float* var, float* inv_std) {
    GRID_STRIDE_INT(ch, c) {
        const double m = sums[2 * c];
        const double mu = sums[ch] / m;
        double v = sums[c + ch] / m - mu * mu;
        if (v < 0.0) v = 0.0;
        mean[ch] = (float)mu;
        var[ch] = (float)v;
        inv_std[ch] = 1.0f / sqrtf((float)v + eps);
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
        chunk_sums(partial, ch, splits, 2, &s1, &s2);
        if ((threadIdx.x & 31) != 0) continue;
        sums[ch] = s1;
        sums[c + ch] = s2;
        if (ch == 0) sums[2 * c] = (double)per;
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

// ---------------------------------------------------------------------------------------------
// The convolution's weight gradient as one GEMM (Caffe's im2col): for x (N, C, H, W) and a
// kh x kw kernel, col (C * kh * kw, N, OH * OW) holds in row q = (c, i, j), for sample n and
// output position p = (oy, ox), the input x[n, c, oy * sh - ph + i * dh, ox * sw - pw + j * dw]
// (0 outside the image). Then dW (K, C*kh*kw) = dy' (K, N * OH*OW) . col^T with
// dy' = dy (N, K, OH*OW) with its first two axes swapped.

struct ConvGeom {
    int n, c, h, w, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow;
};

extern "C" __global__ void im2col_batch(const float* x, float* col, ConvGeom g) {
    const int p_count = g.oh * g.ow;
    const int total = g.c * g.kh * g.kw * g.n * p_count;
    const FastDiv by_p = fast_div(p_count), by_n = fast_div(g.n), by_kw = fast_div(g.kw),
                  by_kh = fast_div(g.kh), by_ow = fast_div(g.ow);
    GRID_STRIDE_INT(t, total) {
        const int np = div_by(t, by_p);
        const int p = t - np * p_count;
        const int q = div_by(np, by_n);
        const int n = np - q * g.n;
        const int qk = div_by(q, by_kw);
        const int j = q - qk * g.kw;
        const int c = div_by(qk, by_kh);
        const int i = qk - c * g.kh;
        const int oy = div_by(p, by_ow);
        const int ox = p - oy * g.ow;
        const int y = oy * g.sh - g.ph + i * g.dh;
        const int xx = ox * g.sw - g.pw + j * g.dw;
        col[t] = (y >= 0 && y < g.h && xx >= 0 && xx < g.w)
                     ? x[((n * g.c + c) * g.h + y) * g.w + xx]
                     : 0.0f;
    }
}

// The weight gradient of an ungrouped NCHW convolution without a column matrix (an implicit
// GEMM): dW (K, C·kh·kw) = Σ_j dy_j (K) ⊗ col_j (C·kh·kw) over j = (n, oy, ox), J = N·OH·OW, the
// column values gathered from x as im2col_batch would lay them out. A block of WARPS warps owns
// a WG_K × TILE_C tile of dW and one chunk of `chunk` consecutive j (a multiple of WG_J), and
// writes its sums to partial (chunks, K, C·kh·kw); wgrad_sum_partials adds the chunks. Each
// thread accumulates a ROWS × 8 sub-tile, so TILE_C = 8 · ROWS · WARPS: the kernels below come in
// sub-tiles of 4 × 8 with 2 to 5 warps (64 to 160 columns) and of 8 × 8 with 2 to 4 (128 to 256
// columns), so that the host can fit the tile's width to C·kh·kw (cifar10_quick's 75 + 1 columns
// fill 96 of them, where a 128-wide tile left 52 idle) and time both sub-tiles: an 8 × 8 one
// reads 16 floats of shared memory per 64 multiply-adds, a 4 × 8 one 12 per 32, and the kernel is
// bound by that pipe, but its tiles are twice as wide. Each step stages STEP values of j in
// shared memory — dy (STEP × WG_K) and the column values (STEP × TILE_C); STEP is WG_J for 4 × 8
// and WG_J / 2 for 8 × 8, which keeps the next step's values, loaded into registers while this
// step's are multiplied, as many per thread — and each thread adds its products by fused
// multiply-adds in ascending j. Every sum runs in a fixed order, given by the chunks (which the
// host fits to the device's waves for the tile that runs), so the result repeats bit for bit, and
// each is a plain FP32 dot product, as exact as the CPU's GEMM. With `with_bias`, column C·kh·kw
// of the gathered matrix is all ones, so that the same products give the bias gradient
// Σ_j dy_j (K), written after the weight's: partial (chunks, K·C·kh·kw + K).
//
// The gather: thread t stages position j0 + t % STEP of each step, for column groups t / STEP,
// t / STEP + LOADERS, … of 4 columns each (LOADERS = threads / STEP), so that a warp's loads of
// one column run along consecutive output positions (contiguous in x within an output row) and
// each group is one float4 store. What a column needs (its offsets in x, whether it is the ones
// column) is worked out once per block in a table.
#define WG_K 32
#define WG_J 32
// An input row offset no window reaches: positions beyond the chunk, and columns beyond the
// tile's, take it, so that their bounds check fails whatever is added to it.
#define WG_NOWHERE (-(1 << 29))

// Where position j lies: x the offset of x[n, 0, y0, x0], y and z the input pixel y0, x0 (the
// top-left one of the window before padding and dilation; y = WG_NOWHERE beyond the chunk), w the
// offset of dy[n, 0, oy, ox].
__device__ __forceinline__ int4 wgrad_locate(int j, int j_end, ConvGeom g, int k_total,
                                             FastDiv by_pq, FastDiv by_ow) {
    if (j >= j_end) return make_int4(0, WG_NOWHERE, 0, 0);
    const int pq = g.oh * g.ow;
    const int n = div_by(j, by_pq), p = j - n * pq;
    const int oy = div_by(p, by_ow), ox = p - oy * g.ow;
    const int y0 = oy * g.sh, x0 = ox * g.sw;
    return make_int4(n * g.c * g.h * g.w + y0 * g.w + x0, y0, x0, n * k_total * pq + p);
}

template <int WARPS, int ROWS>
__device__ __forceinline__ void wgrad_partial_tile(const float* x, const float* dy,
                                                   float* partial, ConvGeom g, int k_total,
                                                   int chunk, int with_bias) {
    static_assert(ROWS == 4 || ROWS == 8, "sub-tiles of 4 × 8 or 8 × 8");
    constexpr int THREADS = 32 * WARPS;
    constexpr int TILE_C = 8 * ROWS * WARPS;
    constexpr int STEP = ROWS == 4 ? WG_J : WG_J / 2;
    constexpr int LOADERS = THREADS / STEP;
    // dy is staged in groups of 4 rows of K (one float4 store each): loader q takes groups q,
    // q + LOADERS, … below WG_K / 4.
    constexpr int DY_GROUPS = (WG_K / 4 + LOADERS - 1) / LOADERS;
    // Column groups each thread gathers per step.
    constexpr int COL_GROUPS = TILE_C / 4 / LOADERS;
    // Rows padded by 4 floats: a warp's float4 stores of consecutive j then spread over all
    // banks, and every row stays on 16 bytes for the float4 reads.
    __shared__ __align__(16) float s_dy[STEP][WG_K + 4];
    __shared__ __align__(16) float s_col[STEP][TILE_C + 4];
    // Per column of the tile: x the offset in x of its channel and kernel offsets (with padding
    // and dilation), y and z those offsets in rows and columns (y = WG_NOWHERE for the ones
    // column and columns beyond C·kh·kw), w the bits of the value it takes outside the image
    // (1 for the ones column, else 0).
    __shared__ int4 s_columns[TILE_C];
    const int tid = threadIdx.x;
    const int rows = g.c * g.kh * g.kw;
    const int pq = g.oh * g.ow;
    const int k0 = blockIdx.y * WG_K, c0 = blockIdx.x * TILE_C;
    const int j_begin = blockIdx.z * chunk;
    const int j_end = min(j_begin + chunk, g.n * pq);
#pragma unroll
    for (int i = 0; i < TILE_C / THREADS; ++i) {
        const int t = tid + i * THREADS;
        const int crs = c0 + t;
        int4 column = make_int4(0, WG_NOWHERE, 0, 0);
        if (crs < rows) {
            const int kx = crs % g.kw, rc = crs / g.kw;
            const int ch = rc / g.kh;
            const int row_off = (rc - ch * g.kh) * g.dh - g.ph, col_off = kx * g.dw - g.pw;
            column = make_int4((ch * g.h + row_off) * g.w + col_off, row_off, col_off, 0);
        } else if (with_bias && crs == rows) {
            column.w = __float_as_int(1.0f);
        }
        s_columns[t] = column;
    }
    // The position this thread stages (its dy values and its column values) and its groups:
    // dy rows 4·(load_q + i·LOADERS).., columns 4·(load_q + i·LOADERS)..
    const int load_j = tid % STEP, load_q = tid / STEP;
    // The ROWS × 8 sub-tile this thread accumulates: rows ROWS·ty.., columns 4·tx.. and
    // TILE_C / 2 + 4·tx.. (two halves, so that a warp's float4 reads of a row are contiguous). A
    // warp covers all WG_K / ROWS values of ty and 32 / (WG_K / ROWS) of tx, so that each of its
    // float4 reads of a step touches at most 128 contiguous bytes: one shared-memory wavefront.
    constexpr int TY = WG_K / ROWS, TX_PER_WARP = 32 / TY;
    const int warp_id = tid / 32, lane_id = tid % 32;
    const int tx = lane_id % TX_PER_WARP + TX_PER_WARP * warp_id, ty = lane_id / TX_PER_WARP;
    float acc[ROWS][8];
#pragma unroll
    for (int a = 0; a < ROWS; ++a) {
#pragma unroll
        for (int b = 0; b < 8; ++b) acc[a][b] = 0.0f;
    }
    const FastDiv by_pq = fast_div(pq), by_ow = fast_div(g.ow);
    float next_dy[4 * DY_GROUPS], next_col[4 * COL_GROUPS];
    // Loads step j0's values of this thread into the registers above.
    auto load = [&](int j0) {
        const int4 at = wgrad_locate(j0 + load_j, j_end, g, k_total, by_pq, by_ow);
        const bool inside = at.y != WG_NOWHERE;
#pragma unroll
        for (int i = 0; i < 4 * DY_GROUPS; ++i) {
            const int group = load_q + (i / 4) * LOADERS;
            const int k = k0 + 4 * group + i % 4;
            next_dy[i] = (inside && group < WG_K / 4 && k < k_total) ? dy[at.w + k * pq] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 4 * COL_GROUPS; ++i) {
            const int4 column = s_columns[4 * (load_q + (i / 4) * LOADERS) + i % 4];
            const unsigned y = at.y + column.y, xx = at.z + column.z;
            next_col[i] = (y < unsigned(g.h) && xx < unsigned(g.w))
                              ? x[at.x + column.x]
                              : (inside ? __int_as_float(column.w) : 0.0f);
        }
    };
    __syncthreads();  // the column table written
    load(j_begin);
    for (int j0 = j_begin; j0 < j_end; j0 += STEP) {
#pragma unroll
        for (int i = 0; i < 4 * DY_GROUPS; i += 4) {
            const int group = load_q + (i / 4) * LOADERS;
            if (group < WG_K / 4) {
                *reinterpret_cast<float4*>(&s_dy[load_j][4 * group]) =
                    make_float4(next_dy[i], next_dy[i + 1], next_dy[i + 2], next_dy[i + 3]);
            }
        }
#pragma unroll
        for (int i = 0; i < 4 * COL_GROUPS; i += 4) {
            const int group = load_q + (i / 4) * LOADERS;
            *reinterpret_cast<float4*>(&s_col[load_j][4 * group]) =
                make_float4(next_col[i], next_col[i + 1], next_col[i + 2], next_col[i + 3]);
        }
        __syncthreads();  // this step staged
        if (j0 + STEP < j_end) load(j0 + STEP);
#pragma unroll
        for (int jj = 0; jj < STEP; ++jj) {
            float av[ROWS];
#pragma unroll
            for (int q = 0; q < ROWS; q += 4) {
                const float4 a = *reinterpret_cast<const float4*>(&s_dy[jj][ROWS * ty + q]);
                av[q] = a.x;
                av[q + 1] = a.y;
                av[q + 2] = a.z;
                av[q + 3] = a.w;
            }
            const float4 b = *reinterpret_cast<const float4*>(&s_col[jj][4 * tx]);
            const float4 e = *reinterpret_cast<const float4*>(&s_col[jj][TILE_C / 2 + 4 * tx]);
            const float bv[8] = {b.x, b.y, b.z, b.w, e.x, e.y, e.z, e.w};
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
            }
        }
        __syncthreads();  // this step's staged values read
    }
    float* out = partial + (long long)blockIdx.z * k_total * (rows + with_bias);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int k = k0 + ROWS * ty + r;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const int col = c0 + (c < 4 ? 4 * tx + c : TILE_C / 2 + 4 * tx + c - 4);
            if (k >= k_total) continue;
            if (col < rows) {
                out[(long long)k * rows + col] = acc[r][c];
            } else if (with_bias && col == rows) {
                out[(long long)k_total * rows + k] = acc[r][c];
            }
        }
    }
}

// wgrad_partial_tile in sub-tiles of 4 × 8 with tiles of 64, 96, 128 and 160 columns (blocks of 2
// to 5 warps), and of 8 × 8 with 128, 192 and 256 columns (2 to 4 warps).
extern "C" __global__ void wgrad_partial_4x8_w2(const float* x, const float* dy, float* partial,
                                                ConvGeom g, int k_total, int chunk, int with_bias) {
    wgrad_partial_tile<2, 4>(x, dy, partial, g, k_total, chunk, with_bias);
}
extern "C" __global__ void wgrad_partial_4x8_w3(const float* x, const float* dy, float* partial,
                                                ConvGeom g, int k_total, int chunk, int with_bias) {
    wgrad_partial_tile<3, 4>(x, dy, partial, g, k_total, chunk, with_bias);
}
extern "C" __global__ void wgrad_partial_4x8_w4(const float* x, const float* dy, float* partial,
                                                ConvGeom g, int k_total, int chunk, int with_bias) {
    wgrad_partial_tile<4, 4>(x, dy, partial, g, k_total, chunk, with_bias);
}
extern "C" __global__ void wgrad_partial_4x8_w5(const float* x, const float* dy, float* partial,
                                                ConvGeom g, int k_total, int chunk, int with_bias) {
    wgrad_partial_tile<5, 4>(x, dy, partial, g, k_total, chunk, with_bias);
}
extern "C" __global__ void wgrad_partial_8x8_w2(const float* x, const float* dy, float* partial,
                                                ConvGeom g, int k_total, int chunk, int with_bias) {
    wgrad_partial_tile<2, 8>(x, dy, partial, g, k_total, chunk, with_bias);
}
extern "C" __global__ void wgrad_partial_8x8_w3(const float* x, const float* dy, float* partial,
                                                ConvGeom g, int k_total, int chunk, int with_bias) {
    wgrad_partial_tile<3, 8>(x, dy, partial, g, k_total, chunk, with_bias);
}
extern "C" __global__ void wgrad_partial_8x8_w4(const float* x, const float* dy, float* partial,
                                                ConvGeom g, int k_total, int chunk, int with_bias) {
    wgrad_partial_tile<4, 8>(x, dy, partial, g, k_total, chunk, with_bias);
}

// dw (n) = Σ over `chunks` of partial (chunks, n) [+ beta · dw]: a block of 8 warps per 32
// consecutive elements, warp w adding chunks w, w + 8, … in ascending order, then the eight
// warp sums in warp order — a fixed order whatever the launch. beta 0 never reads dw.
extern "C" __global__ void wgrad_sum_partials(const float* partial, float* dw, int n, int chunks,
                                              float beta) {
    __shared__ float warp_sums[8][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int base = blockIdx.x * 32; base < n; base += gridDim.x * 32) {
        const int i = base + lane;
        float sum = 0.0f;
        if (i < n) {
            for (int c = warp; c < chunks; c += 8) sum += partial[(long long)c * n + i];
        }
        warp_sums[warp][lane] = sum;
        __syncthreads();
        if (warp == 0 && i < n) {
            float total = 0.0f;
            for (int w = 0; w < 8; ++w) total += warp_sums[w][lane];
            dw[i] = beta == 0.0f ? total : beta * dw[i] + total;
        }
        __syncthreads();
    }
}

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

// y (b, a, p) = x (a, b, p) with its first two axes swapped.
extern "C" __global__ void swap_outer(const float* x, float* y, int a, int b, int p) {
    const int total = a * b * p;
    const FastDiv by_p = fast_div(p), by_b = fast_div(b);
    GRID_STRIDE_INT(t, total) {
        const int ij = div_by(t, by_p);
        const int q = t - ij * p;
        const int i = div_by(ij, by_b);
        const int j = ij - i * b;
        y[(j * a + i) * p + q] = x[t];
    }
}

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

// ---------------------------------------------------------------------------------------------
// Power and absolute value.

// y = (shift + scale * x)^power (1 when power is 0).
extern "C" __global__ void power_forward(const float* x, float* y, int n, float power,
                                         float scale, float shift) {
    GRID_STRIDE_INT(i, n) {
        const float t = shift + scale * x[i];
        y[i] = power == 0.0f ? 1.0f : (power == 1.0f ? t : powf(t, power));
    }
}

// dx (+)= dy * power * scale * (shift + scale * x)^(power - 1)
extern "C" __global__ void power_backward(const float* x, const float* dy, float* dx, int n,
                                          float power, float scale, float shift,
                                          int accumulate) {
    GRID_STRIDE_INT(i, n) {
        const float t = shift + scale * x[i];
        float d;
        if (power == 0.0f || scale == 0.0f) {
            d = 0.0f;
        } else if (power == 1.0f) {
            d = scale;
        } else if (power == 2.0f) {
            d = 2.0f * scale * t;
        } else {
            d = power * scale * powf(t, power - 1.0f);
        }
        const float g = dy[i] * d;
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

extern "C" __global__ void abs_forward(const float* x, float* y, int n) {
    GRID_STRIDE_INT(i, n) y[i] = fabsf(x[i]);
}

// dx (+)= sign(x) * dy (0 at 0)
extern "C" __global__ void abs_backward(const float* x, const float* dy, float* dx, int n,
                                        int accumulate) {
    GRID_STRIDE_INT(i, n) {
        const float v = x[i];
        const float g = v > 0.0f ? dy[i] : (v < 0.0f ? -dy[i] : 0.0f);
        dx[i] = accumulate ? dx[i] + g : g;
    }
}
