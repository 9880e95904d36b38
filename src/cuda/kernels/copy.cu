// ---------------------------------------------------------------------------------------------
// Copies between layouts: strided rows, strided planes, batched transposes.

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
// cols = H * W, or the reverse) and KCRS <-> KRSC filters, in one of two ways the launcher picks
// by its block shape (copy.rs, transpose_grid). Blocks of 32 x 8 threads, where both sides hold a
// tile (or a matrix's elements pass an int): each moves one 32 x 32 tile (blockIdx.x along cols,
// blockIdx.y along rows, blockIdx.z the matrix) through shared memory, so that reads and writes
// are both whole runs. Blocks of one row of threads, else (a filter's few taps: cols = kh * kw,
// 1 for a 1 x 1 convolution): the blocks along x stride over the matrix blockIdx.z's elements in
// y's order, writing whole runs and reading runs of a few columns. load(x, i) reads element i of
// x as a float, store(y, i, v) writes (or adds) v at element i of y: the element types may differ
// (half-type bit patterns on either side).
template <class In, class Out, class Load, class Store>
__device__ __forceinline__ void transpose_elements(const In* x, Out* y, int rows, int cols,
                                                   Load load, Store store) {
    const long long base = (long long)blockIdx.z * rows * cols;
    const int n = rows * cols;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int c = i / rows, r = i - c * rows;
        store(y, base + i, load(x, base + (long long)r * cols + c));
    }
}

template <class In, class Out, class Load, class Store>
__device__ __forceinline__ void transpose_by_tiles(const In* x, Out* y, int rows, int cols,
                                                   Load load, Store store) {
    __shared__ float tile[32][33];
    const long long base = (long long)blockIdx.z * rows * cols;
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int dr = threadIdx.y; dr < 32; dr += 8) {
        const int r = r0 + dr, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[dr][threadIdx.x] = load(x, base + (long long)r * cols + c);
    }
    __syncthreads();
    for (int dc = threadIdx.y; dc < 32; dc += 8) {
        const int c = c0 + dc, r = r0 + threadIdx.x;
        if (r < rows && c < cols) store(y, base + (long long)c * rows + r, tile[threadIdx.x][dc]);
    }
}

// transpose_by_tiles or transpose_elements, as the launch's block shape says.
template <class In, class Out, class Load, class Store>
__device__ __forceinline__ void transpose_tiles(const In* x, Out* y, int rows, int cols, Load load,
                                                Store store) {
    if (blockDim.y > 1) {
        transpose_by_tiles(x, y, rows, cols, load, store);
    } else {
        transpose_elements(x, y, rows, cols, load, store);
    }
}

extern "C" __global__ void transpose_batched(const float* x, float* y, int rows, int cols,
                                             int accumulate) {
    transpose_tiles(
        x, y, rows, cols, [](const float* x, long long i) { return x[i]; },
        [=](float* y, long long i, float v) { y[i] = accumulate ? y[i] + v : v; });
}

// ---------------------------------------------------------------------------------------------
// Half-type storage (mixed precision's half-type blobs, bf16 or fp16 when fp16): conversions
// between an FP32 blob and a half-type one, and the weights and weight gradients of the layers
// that run on half-type tensors.

// y (n) (+)= x widened: the FP32 copy of a half-type blob; a half-type copy's gradient added to
// (or written into) an FP32 blob's.
extern "C" __global__ void widen_half(const unsigned short* x, float* y, int fp16, int accumulate,
                                      long long n) {
    GRID_STRIDE_LONG(i, n) {
        const float v = load_value(x + i, 0, fp16 ? 2 : 1);
        y[i] = accumulate ? y[i] + v : v;
    }
}

// y (n) = the half-type bits of (accumulate ? y widened + x : x), rounded once: the half-type copy
// of an FP32 blob; an FP32 copy's gradient added to (or written into) a half-type blob's.
extern "C" __global__ void narrow_half(const float* x, unsigned short* y, int fp16, int accumulate,
                                       long long n) {
    GRID_STRIDE_LONG(i, n) {
        const float v = accumulate ? load_value(y + i, 0, fp16 ? 2 : 1) + x[i] : x[i];
        y[i] = half_bits(v, fp16);
    }
}

// y (n) (+)= x rounded to the half type: a weight gradient computed in FP32, rounded once, added
// in FP32.
extern "C" __global__ void add_rounded(const float* x, float* y, int fp16, int accumulate,
                                       long long n) {
    GRID_STRIDE_LONG(i, n) {
        const float v = round_to_half(x[i], fp16);
        y[i] = accumulate ? y[i] + v : v;
    }
}

// transpose_batched from FP32 into half-type bits (rounded): a KCRS weight into a KRSC one.
extern "C" __global__ void transpose_to_half(const float* x, unsigned short* y, int rows, int cols,
                                             int fp16) {
    transpose_tiles(
        x, y, rows, cols, [](const float* x, long long i) { return x[i]; },
        [=](unsigned short* y, long long i, float v) { y[i] = half_bits(v, fp16); });
}

// transpose_batched from half-type bits into FP32 (+)=: a KRSC weight gradient into a KCRS one.
extern "C" __global__ void transpose_widen(const unsigned short* x, float* y, int rows, int cols,
                                           int accumulate, int fp16) {
    transpose_tiles(
        x, y, rows, cols,
        [=](const unsigned short* x, long long i) { return load_value(x + i, 0, fp16 ? 2 : 1); },
        [=](float* y, long long i, float v) { y[i] = accumulate ? y[i] + v : v; });
}
