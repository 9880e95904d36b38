// ---------------------------------------------------------------------------------------------
// A batch's inputs that travelled as 8-bit pixels, normalised on the device.

// y[i] = (x[i] - mean[c]) * scale for the (n, C, H, W) pixels x, c = (i / plane) % channels: the
// widening is exact, and the subtraction and the product each round to nearest once (__fsub_rn,
// __fmul_rn: never contracted into a multiply-add), as p2ptrain::data::Normalize on the CPU.
extern "C" __global__ void normalize_u8(const unsigned char* x, float* y, const float* mean,
                                        int channels, long long plane, float scale,
                                        long long n) {
    GRID_STRIDE_LONG(i, n) {
        const int c = (int)((i / plane) % channels);
        y[i] = __fmul_rn(__fsub_rn((float)x[i], mean[c]), scale);
    }
}
