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
