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
