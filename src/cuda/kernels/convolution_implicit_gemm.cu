// ---------------------------------------------------------------------------------------------
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
