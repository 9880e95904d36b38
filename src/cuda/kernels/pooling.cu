// ---------------------------------------------------------------------------------------------
// Pooling, Caffe's kernels (BVLC pooling_layer.cu) with its output sizes.
//
// In mixed precision (`half` of PoolGeom: 1 bf16, 2 fp16, 0 none; round_if_half) every kernel
// rounds what it reads — the bottom's values, the top's diffs — and what it writes — the top,
// the bottom's diff after its sum (and after the addition to what the diff held) — where the
// CPU's layers round: a pooling's own results, and a fused ReLU's before it (a ReLU of slope 0
// keeps half-type values, so it needs none of its own).
//
// The bottom's and the top's values and gradients may be stored in the half type: each kernel
// is a template body over their element type T (float, or half-type bit patterns: load_value,
// store_value in elementwise.cu) behind the FP32 kernel and its `_h` twin, which compute the same
// numbers.

struct PoolGeom {
    int channels, height, width, pooled_h, pooled_w, kernel_h, kernel_w, stride_h, stride_w,
        pad_h, pad_w, nhwc, half;
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

// The window of top pixel (ph, pw) clipped to the image: rows [hstart, hend), columns
// [wstart, wend).
__device__ __forceinline__ void image_window(int ph, int pw, const PoolGeom& g, int* hstart,
                                             int* hend, int* wstart, int* wend) {
    const int h0 = ph * g.stride_h - g.pad_h, w0 = pw * g.stride_w - g.pad_w;
    *hend = min(h0 + g.kernel_h, g.height);
    *wend = min(w0 + g.kernel_w, g.width);
    *hstart = max(h0, 0);
    *wstart = max(w0, 0);
}

// One thread per top element: the maximum of the window clipped to the image, and its index
// h * width + w in the (n, c) plane (the first maximum in row-major order wins). With `relu` (a
// ReLU after the pooling, fused): a maximum that is not positive becomes 0 with index -1, so
// that the backward, which gives each bottom element the top diffs whose index it is, passes no
// gradient through it — the ReLU's derivative.
template <class T>
__device__ __forceinline__ void max_pool_forward_of(const T* x, T* y, int* mask, int top_count,
                                                    PoolGeom g, int relu) {
    const FastDiv by_pw = fast_div(g.pooled_w), by_ph = fast_div(g.pooled_h);
    const FastDiv by_c = fast_div(g.channels);
    const int step = g.nhwc ? g.channels : 1;
    GRID_STRIDE_INT(index, top_count) {
        int ph, pw, n, ch;
        plane_of(index, by_pw, by_ph, by_c, g.nhwc, &ph, &pw, &n, &ch);
        int hstart, hend, wstart, wend;
        image_window(ph, pw, g, &hstart, &hend, &wstart, &wend);
        float maxval = -3.402823466e+38f;
        int maxidx = -1;
        const T* slice = x + plane_base(n, ch, g.channels, g.height * g.width, g.nhwc);
        for (int h = hstart; h < hend; ++h) {
            for (int w = wstart; w < wend; ++w) {
                const float v =
                    round_if_half(load_value(slice, (h * g.width + w) * step, g.half), g.half);
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
        store_value(y, index, maxval, g.half);
        mask[index] = maxidx;
    }
}

extern "C" __global__ void max_pool_forward(const float* x, float* y, int* mask, int top_count,
                                            PoolGeom g, int relu) {
    max_pool_forward_of(x, y, mask, top_count, g, relu);
}

// max_pool_forward on half-type x and y.
extern "C" __global__ void max_pool_forward_h(const unsigned short* x, unsigned short* y,
                                              int* mask, int top_count, PoolGeom g, int relu) {
    max_pool_forward_of(x, y, mask, top_count, g, relu);
}

// The max pooling kernels' `_h8` twins over channels-last half-type tensors of a multiple of 8
// channels, every buffer 16-byte aligned: a thread takes eight adjacent channels of one pixel
// (one 16-byte access a tensor, the mask's eight indices in two), so that the pixel's
// coordinates and windows are found once for eight elements. Each channel compares and adds
// what the `_h` kernels compare and add, in their order: the same results. Compile-time HALF
// (1 bf16, 2 fp16); a value loaded from a half-type tensor needs no rounding.

// The first channel of group q of eight channels of a channels-last (N, rows, cols, C) tensor
// (channels 8 (q mod C/8) .. + 8 of pixel q div (C/8), `c8` C/8), and its pixel's n, row and
// column.
__device__ __forceinline__ int group_pixel(int q, FastDiv c8, FastDiv cols, FastDiv rows, int* n,
                                           int* r, int* c) {
    const int pixel = div_by(q, c8);
    plane_pos(pixel, cols, rows, n, r, c);
    return (q - pixel * (int)c8.d) << 3;
}

// max_pool_forward_of over groups of eight channels (group_pixel) of the top.
template <int HALF>
__device__ __forceinline__ void max_pool_forward_by_eight(const unsigned short* x,
                                                          unsigned short* y, int* mask,
                                                          int groups, PoolGeom g, int relu) {
    const FastDiv by_pw = fast_div(g.pooled_w), by_ph = fast_div(g.pooled_h);
    const FastDiv by_c8 = fast_div(g.channels >> 3);
    GRID_STRIDE_INT(q, groups) {
        int n, ph, pw;
        const int ch0 = group_pixel(q, by_c8, by_pw, by_ph, &n, &ph, &pw);
        int hstart, hend, wstart, wend;
        image_window(ph, pw, g, &hstart, &hend, &wstart, &wend);
        Eight best;
        int idx[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            best.v[e] = -3.402823466e+38f;
            idx[e] = -1;
        }
        const unsigned short* image = x + (long long)n * g.height * g.width * g.channels + ch0;
        for (int h = hstart; h < hend; ++h) {
            for (int w = wstart; w < wend; ++w) {
                const int at = h * g.width + w;
                const Eight v = widen_eight<HALF>(raw_eight(image + at * g.channels, 0));
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    if (v.v[e] > best.v[e]) {
                        idx[e] = at;
                        best.v[e] = v.v[e];
                    }
                }
            }
        }
        if (relu) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                if (!(best.v[e] > 0.0f)) {
                    best.v[e] = 0.0f;
                    idx[e] = -1;
                }
            }
        }
        store_eight_pairs<HALF>(y, q << 3, best);
        int4* m = reinterpret_cast<int4*>(mask + (q << 3));
        m[0] = make_int4(idx[0], idx[1], idx[2], idx[3]);
        m[1] = make_int4(idx[4], idx[5], idx[6], idx[7]);
    }
}

// max_pool_forward_h over channels-last tensors, eight channels a thread (see above); `groups`
// is the top's count / 8.
extern "C" __global__ void max_pool_forward_h8(const unsigned short* x, unsigned short* y,
                                               int* mask, int groups, PoolGeom g, int relu) {
    if (g.half == 2) {
        max_pool_forward_by_eight<2>(x, y, mask, groups, g, relu);
    } else {
        max_pool_forward_by_eight<1>(x, y, mask, groups, g, relu);
    }
}

// One thread per top element: the window's sum divided by its size clipped to
// [-pad, size + pad) (padding counts, the part beyond the padded image does not). With `relu` (a
// ReLU before the pooling, fused): each value read goes through the ReLU of slope `slope` first.
template <class T>
__device__ __forceinline__ void ave_pool_forward_of(const T* x, T* y, int top_count, PoolGeom g,
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
        const T* slice = x + plane_base(n, ch, g.channels, g.height * g.width, g.nhwc);
        for (int h = hstart; h < hend; ++h) {
            for (int w = wstart; w < wend; ++w) {
                const float v =
                    round_if_half(load_value(slice, (h * g.width + w) * step, g.half), g.half);
                aveval += (relu && !(v > 0.0f)) ? slope * v : v;
            }
        }
        store_value(y, index, round_if_half(aveval / pool_size, g.half), g.half);
    }
}

extern "C" __global__ void ave_pool_forward(const float* x, float* y, int top_count, PoolGeom g,
                                            int relu, float slope) {
    ave_pool_forward_of(x, y, top_count, g, relu, slope);
}

// ave_pool_forward on half-type x and y.
extern "C" __global__ void ave_pool_forward_h(const unsigned short* x, unsigned short* y,
                                              int top_count, PoolGeom g, int relu, float slope) {
    ave_pool_forward_of(x, y, top_count, g, relu, slope);
}

// One thread per bottom element: the sum of the top diffs whose argmax it is (no atomics).
template <class T>
__device__ __forceinline__ void max_pool_backward_of(const T* dy, const int* mask, T* dx,
                                                     int bottom_count, PoolGeom g,
                                                     int accumulate) {
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
        const T* dy_slice = dy + offset;
        const int* mask_slice = mask + offset;
        const int self = h * g.width + w;
        if (phend - phstart <= 2 && pwend - pwstart <= 2) {
            // At most 2 x 2 windows (a kernel of up to twice the stride, as 3 x 3 by 2): their
            // argmaxes and diffs are all loaded before any is compared, so that the loads
            // overlap, and added in the loop's order below.
            int m[4];
            float d[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int ph = phstart + (k >> 1), pw = pwstart + (k & 1);
                const bool inside = ph < phend && pw < pwend;
                const int p = (ph * g.pooled_w + pw) * step;
                m[k] = inside ? mask_slice[p] : -1;
                d[k] = inside ? load_value(dy_slice, p, g.half) : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 4; ++k)
                if (m[k] == self) gradient += round_if_half(d[k], g.half);
        } else {
            for (int ph = phstart; ph < phend; ++ph) {
                for (int pw = pwstart; pw < pwend; ++pw) {
                    const int p = (ph * g.pooled_w + pw) * step;
                    if (mask_slice[p] == self)
                        gradient += round_if_half(load_value(dy_slice, p, g.half), g.half);
                }
            }
        }
        const float sum = accumulate ? load_value(dx, index, g.half) + gradient : gradient;
        store_value(dx, index, round_if_half(sum, g.half), g.half);
    }
}

extern "C" __global__ void max_pool_backward(const float* dy, const int* mask, float* dx,
                                             int bottom_count, PoolGeom g, int accumulate) {
    max_pool_backward_of(dy, mask, dx, bottom_count, g, accumulate);
}

// max_pool_backward on half-type dy and dx.
extern "C" __global__ void max_pool_backward_h(const unsigned short* dy, const int* mask,
                                               unsigned short* dx, int bottom_count, PoolGeom g,
                                               int accumulate) {
    max_pool_backward_of(dy, mask, dx, bottom_count, g, accumulate);
}

// max_pool_backward_of over groups of eight channels (group_pixel) of the bottom: each channel
// adds the diffs of the covering windows whose argmax it is, in ascending (ph, pw).
template <int HALF>
__device__ __forceinline__ void max_pool_backward_by_eight(const unsigned short* dy,
                                                           const int* mask, unsigned short* dx,
                                                           int groups, PoolGeom g,
                                                           int accumulate) {
    const FastDiv by_w = fast_div(g.width), by_h = fast_div(g.height);
    const FastDiv by_sh = fast_div(g.stride_h), by_sw = fast_div(g.stride_w);
    const FastDiv by_c8 = fast_div(g.channels >> 3);
    GRID_STRIDE_INT(q, groups) {
        int n, h, w;
        const int ch0 = group_pixel(q, by_c8, by_w, by_h, &n, &h, &w);
        int phstart, phend, pwstart, pwend;
        covering(h + g.pad_h, g.kernel_h, by_sh, g.pooled_h, &phstart, &phend);
        covering(w + g.pad_w, g.kernel_w, by_sw, g.pooled_w, &pwstart, &pwend);
        const long long top = (long long)n * g.pooled_h * g.pooled_w * g.channels + ch0;
        const int self = h * g.width + w;
        Eight grad;
#pragma unroll
        for (int e = 0; e < 8; ++e) grad.v[e] = 0.0f;
        for (int ph = phstart; ph < phend; ++ph) {
            for (int pw = pwstart; pw < pwend; ++pw) {
                const long long p = top + (long long)(ph * g.pooled_w + pw) * g.channels;
                const int4* mp = reinterpret_cast<const int4*>(mask + p);
                const int4 m0 = mp[0], m1 = mp[1];
                const int m[8] = {m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w};
                const Eight d = widen_eight<HALF>(raw_eight(dy + p, 0));
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    if (m[e] == self) grad.v[e] += d.v[e];
                }
            }
        }
        if (accumulate) {
            const Eight old = widen_eight<HALF>(raw_eight(dx, q));
#pragma unroll
            for (int e = 0; e < 8; ++e) grad.v[e] = old.v[e] + grad.v[e];
        }
        store_eight_pairs<HALF>(dx, q << 3, grad);
    }
}

// max_pool_backward_h over channels-last tensors, eight channels a thread (see
// max_pool_forward_h8); `groups` is the bottom's count / 8.
extern "C" __global__ void max_pool_backward_h8(const unsigned short* dy, const int* mask,
                                                unsigned short* dx, int groups, PoolGeom g,
                                                int accumulate) {
    if (g.half == 2) {
        max_pool_backward_by_eight<2>(dy, mask, dx, groups, g, accumulate);
    } else {
        max_pool_backward_by_eight<1>(dy, mask, dx, groups, g, accumulate);
    }
}

// One thread per bottom element: the sum over the windows covering it of top diff / pool size;
// with `relu` (fused before the pooling), times the ReLU's derivative at the bottom's value x.
template <class T>
__device__ __forceinline__ void ave_pool_backward_of(const T* dy, T* dx, int bottom_count,
                                                     PoolGeom g, int accumulate, const T* x,
                                                     int relu, float slope) {
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
        const T* dy_slice = dy + plane_base(n, ch, g.channels, g.pooled_h * g.pooled_w, g.nhwc);
        for (int ph = phstart; ph < phend; ++ph) {
            const int hstart = ph * g.stride_h - g.pad_h;
            const int hend = min(hstart + g.kernel_h, g.height + g.pad_h);
            for (int pw = pwstart; pw < pwend; ++pw) {
                const int wstart = pw * g.stride_w - g.pad_w;
                const int wend = min(wstart + g.kernel_w, g.width + g.pad_w);
                const int pool_size = (hend - hstart) * (wend - wstart);
                const float d = load_value(dy_slice, (ph * g.pooled_w + pw) * step, g.half);
                gradient += round_if_half(d, g.half) / pool_size;
            }
        }
        if (relu) {
            // The pooling's bottom diff, rounded, is the ReLU's top diff.
            gradient = round_if_half(gradient, g.half);
            if (!(round_if_half(load_value(x, index, g.half), g.half) > 0.0f))
                gradient = slope * gradient;
        }
        const float sum = accumulate ? load_value(dx, index, g.half) + gradient : gradient;
        store_value(dx, index, round_if_half(sum, g.half), g.half);
    }
}

extern "C" __global__ void ave_pool_backward(const float* dy, float* dx, int bottom_count,
                                             PoolGeom g, int accumulate, const float* x, int relu,
                                             float slope) {
    ave_pool_backward_of(dy, dx, bottom_count, g, accumulate, x, relu, slope);
}

// ave_pool_backward on half-type dy, dx and x.
extern "C" __global__ void ave_pool_backward_h(const unsigned short* dy, unsigned short* dx,
                                               int bottom_count, PoolGeom g, int accumulate,
                                               const unsigned short* x, int relu, float slope) {
    ave_pool_backward_of(dy, dx, bottom_count, g, accumulate, x, relu, slope);
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
// The body of both twins, `smem` the kernel's dynamic shared memory.
template <class T>
__device__ __forceinline__ void pool_backward_planes_of(int* smem, const T* dy, const int* mask,
                                                        T* dx, int planes, PoolGeom g,
                                                        int average, int accumulate, const T* x,
                                                        int relu, float slope, int per_pass) {
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
                const float d = round_if_half(load_value(dy + top, t, g.half), g.half);
                pass_dy[t] = d / (h_div[ph] * w_div[pw]);
            } else {
                pass_dy[t] = round_if_half(load_value(dy + top, t, g.half), g.half);
                pass_mask[t] = mask[top + t];
            }
        }
        __syncthreads();
        T* pdx = dx + (long long)first * area;
        const T* px = x + (long long)first * area;
        const int n = count * area;
        for (int t0 = threadIdx.x; t0 < n; t0 += PLANE_RUN * blockDim.x) {
            float below[PLANE_RUN], old[PLANE_RUN];
#pragma unroll
            for (int e = 0; e < PLANE_RUN; ++e) {
                const int t = t0 + e * blockDim.x;
                below[e] =
                    (relu && t < n) ? round_if_half(load_value(px, t, g.half), g.half) : 0.0f;
                old[e] = (accumulate && t < n) ? load_value(pdx, t, g.half) : 0.0f;
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
                    if (relu) {
                        gradient = round_if_half(gradient, g.half);
                        if (!(below[e] > 0.0f)) gradient = slope * gradient;
                    }
                    const float sum = accumulate ? old[e] + gradient : gradient;
                    store_value(pdx, t, round_if_half(sum, g.half), g.half);
                }
            }
        }
    }
}

extern "C" __global__ void pool_backward_planes(const float* dy, const int* mask, float* dx,
                                                int planes, PoolGeom g, int average,
                                                int accumulate, const float* x, int relu,
                                                float slope, int per_pass) {
    extern __shared__ int smem[];
    pool_backward_planes_of(smem, dy, mask, dx, planes, g, average, accumulate, x, relu, slope,
                            per_pass);
}

// pool_backward_planes on half-type dy, dx and x.
extern "C" __global__ void pool_backward_planes_h(const unsigned short* dy, const int* mask,
                                                  unsigned short* dx, int planes, PoolGeom g,
                                                  int average, int accumulate,
                                                  const unsigned short* x, int relu, float slope,
                                                  int per_pass) {
    extern __shared__ int smem[];
    pool_backward_planes_of(smem, dy, mask, dx, planes, g, average, accumulate, x, relu, slope,
                            per_pass);
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
template <class T>
__device__ __forceinline__ void max_pool_backward_scatter_of(int* smem, const T* dy,
                                                             const int* mask, T* dx, int planes,
                                                             PoolGeom g, int rounds_h,
                                                             int rounds_w, int accumulate) {
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
            plane_dy[p] = round_if_half(load_value(dy + top, p, g.half), g.half);
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
        T* pdx = dx + (long long)plane * area;
        for (int i = threadIdx.x; i < area; i += blockDim.x) {
            const float sum =
                accumulate ? load_value(pdx, i, g.half) + plane_dx[i] : plane_dx[i];
            store_value(pdx, i, round_if_half(sum, g.half), g.half);
        }
    }
}

extern "C" __global__ void max_pool_backward_scatter(const float* dy, const int* mask, float* dx,
                                                     int planes, PoolGeom g, int rounds_h,
                                                     int rounds_w, int accumulate) {
    extern __shared__ int smem[];
    max_pool_backward_scatter_of(smem, dy, mask, dx, planes, g, rounds_h, rounds_w, accumulate);
}

// max_pool_backward_scatter on half-type dy and dx.
extern "C" __global__ void max_pool_backward_scatter_h(const unsigned short* dy, const int* mask,
                                                       unsigned short* dx, int planes,
                                                       PoolGeom g, int rounds_h, int rounds_w,
                                                       int accumulate) {
    extern __shared__ int smem[];
    max_pool_backward_scatter_of(smem, dy, mask, dx, planes, g, rounds_h, rounds_w, accumulate);
}
