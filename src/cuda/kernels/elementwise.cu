// ---------------------------------------------------------------------------------------------
// Vector helpers over (n) floats.

extern "C" __global__ void fill(float* x, float value, long long n) {
    GRID_STRIDE_LONG(i, n) x[i] = value;
}

// x = value * factor[0]: a constant times a device scalar (the loss gradient times the loss scale).
extern "C" __global__ void fill_scaled(float* x, float value, const float* factor, long long n) {
    const float v = value * factor[0];
    GRID_STRIDE_LONG(i, n) x[i] = v;
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

// ---------------------------------------------------------------------------------------------
// ELU.

// y = max(x, 0) + alpha * (exp(min(x, 0)) - 1)
extern "C" __global__ void elu_forward(const float* x, float* y, float alpha, int n) {
    GRID_STRIDE_INT(i, n) {
        const float v = x[i];
        y[i] = fmaxf(v, 0.0f) + alpha * (expf(fminf(v, 0.0f)) - 1.0f);
    }
}

// dx (+)= dy * (x > 0 ? 1 : alpha * (exp(x) - 1) + alpha), the top recomputed from x.
extern "C" __global__ void elu_backward(const float* x, const float* dy, float* dx, float alpha,
                                        int n, int accumulate) {
    GRID_STRIDE_INT(i, n) {
        const float v = x[i];
        const float g = v > 0.0f ? dy[i] : dy[i] * (alpha * (expf(fminf(v, 0.0f)) - 1.0f) + alpha);
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

// ---------------------------------------------------------------------------------------------
// Mixed precision's rounding (`crate::precision`): a float rounded to the half type, to nearest
// with ties to even, and widened back exactly; a NaN stays a NaN. bf16 keeps the top 16 bits of
// the float (8 significant bits, FP32's range); fp16 goes through the hardware conversion
// (11 significant bits, beyond 65504 an infinity, subnormals below 2^-14).

__device__ __forceinline__ float round_to_half(float v, int fp16) {
    if (fp16) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        float r;
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
        return r;
    }
#if __CUDA_ARCH__ >= 800
    // The hardware conversion (one instruction; the same rounding as the bit arithmetic below).
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return v != v ? v : __uint_as_float((unsigned)h << 16);
#else
    const unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return v;
    return __uint_as_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
#endif
}

// v rounded to the half type `half` (1 bf16, 2 fp16), or as it is (0): the rounding of the
// kernels that take mixed precision's half type as an argument.
__device__ __forceinline__ float round_if_half(float v, int half) {
    return half ? round_to_half(v, half == 2) : v;
}

// x (n) rounded in place.
extern "C" __global__ void round_half(float* x, int fp16, long long n) {
    GRID_STRIDE_LONG(i, n) x[i] = round_to_half(x[i], fp16);
}

// y (n) = x rounded.
extern "C" __global__ void round_half_copy(const float* x, float* y, int fp16, long long n) {
    GRID_STRIDE_LONG(i, n) y[i] = round_to_half(x[i], fp16);
}

// The bit pattern of v in the half type (bf16 or fp16), rounded as round_to_half rounds.
__device__ __forceinline__ unsigned short half_bits(float v, int fp16) {
    if (fp16) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return h;
    }
    const unsigned u = __float_as_uint(round_to_half(v, 0));
    // A NaN keeps its sign and upper payload and gets the quiet bit, so that it stays a NaN.
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
    return (unsigned short)(u >> 16);
}

// h (n) = the half-type bit patterns of x rounded (exact where x already holds half values).
extern "C" __global__ void to_half(const float* x, unsigned short* h, int fp16, long long n) {
    GRID_STRIDE_LONG(i, n) h[i] = half_bits(x[i], fp16);
}

// ---------------------------------------------------------------------------------------------
// Tensors stored in the half type. The kernels of the layers that run on such blobs (the fused
// chains, the poolings) are template bodies over the element type T of their activations: float,
// or unsigned short holding bit patterns of the half type `half` (1 bf16, 2 fp16), each behind
// two extern "C" kernels, the FP32 one and its `_h` twin. Their loads and stores go through
// load_value and store_value: on floats the plain access, so the FP32 kernels compute what they
// did; on bit patterns a load widens to FP32 exactly (a half-type value, which round_if_half then
// leaves as it is) and a store writes the bit pattern of v rounded (half_bits), where the kernel
// stores a value it has rounded already, or one of the half-type values it read.

__device__ __forceinline__ float load_value(const float* p, int i, int) { return p[i]; }

// The FP32 value of the bit pattern p[i] of the half type `half` (1 bf16, 2 fp16), exactly.
__device__ __forceinline__ float load_value(const unsigned short* p, int i, int half) {
    const unsigned short h = p[i];
    if (half == 2) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    return __uint_as_float((unsigned)h << 16);
}

__device__ __forceinline__ void store_value(float* p, int i, float v, int) { p[i] = v; }

__device__ __forceinline__ void store_value(unsigned short* p, int i, float v, int half) {
    p[i] = half_bits(v, half == 2);
}

// Runs the statement `call` (a kernel body's call of its inlined template) with `half`, the
// kernel's half-type argument (1 bf16, 2 fp16), shadowed by a compile-time constant of its value,
// so that the inlined code holds no branch on it: the half-type kernels' load, store and rounding
// helpers test `half` at each element otherwise (about 85 instructions an element in the
// BatchNorm chain's forward on half-type blobs, under Nsight Compute on an H200).
#define WITH_HALF_CONSTANT(call)                                                                  \
    do {                                                                                          \
        if (half == 2) {                                                                          \
            constexpr int half = 2;                                                               \
            call;                                                                                 \
        } else {                                                                                  \
            constexpr int half = 1;                                                               \
            call;                                                                                 \
        }                                                                                         \
    } while (0)

// Half-type tensors eight elements at a time: one 16-byte access per tensor instead of eight
// 2-byte ones, which leave most of each memory transaction unused (the residual sum on
// half-type blobs ran at FP32's time per element). `i0` is a multiple of 8 and the buffer 16-byte
// aligned (every device allocation is; a kernel given a view into one checks with `by_eight`).
// Values widened and stored as load_value and store_value do, so the results are theirs.
struct Eight {
    float v[8];
};

// Whether `n` elements of the buffers `p` can go eight at a time: whole groups of eight, each
// buffer 16-byte aligned (a null one, never accessed, is).
template <class... P>
__device__ __forceinline__ bool by_eight(int n, const P*... p) {
    unsigned long long bits = 0;
    ((bits |= reinterpret_cast<unsigned long long>(p)), ...);
    return n % 8 == 0 && (bits & 15) == 0;
}

__device__ __forceinline__ Eight load_eight(const unsigned short* p, int i0, int half) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p + i0);
    const unsigned short* e = reinterpret_cast<const unsigned short*>(&raw);
    Eight out;
#pragma unroll
    for (int j = 0; j < 8; ++j) out.v[j] = load_value(e, j, half);
    return out;
}

__device__ __forceinline__ void store_eight(unsigned short* p, int i0, const Eight& x, int half) {
    uint4 raw;
    unsigned short* e = reinterpret_cast<unsigned short*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) store_value(e, j, x.v[j], half);
    *reinterpret_cast<uint4*>(p + i0) = raw;
}

// Pairs of half-type values in one 32-bit word, the first in the low half: the kernels that read
// four or eight channels-last channels a thread (the BatchNorm chain's `_h8`) round and store two
// values with one conversion instruction (compute capability 8.0 and later). Compile-time `HALF`
// (1 bf16, 2 fp16). A value that is not a NaN is rounded as round_to_half rounds it and stored
// as half_bits stores it; a NaN stays a NaN, the conversion's canonical one (the pattern that
// half_bits makes of the canonical NaN float arithmetic yields).

// The bit patterns of lo and hi rounded to the half type.
template <int HALF>
__device__ __forceinline__ unsigned pack_pair(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned r;
    if (HALF == 2) {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
#else
    return (unsigned)half_bits(lo, HALF == 2) | ((unsigned)half_bits(hi, HALF == 2) << 16);
#endif
}

// The FP32 values of the two half-type bit patterns of w, exactly (as load_value widens).
template <int HALF>
__device__ __forceinline__ float2 unpack_pair(unsigned w) {
    if (HALF == 2) {
        const unsigned short lo = (unsigned short)(w & 0xffffu), hi = (unsigned short)(w >> 16);
        float2 r;
        asm("cvt.f32.f16 %0, %1;" : "=f"(r.x) : "h"(lo));
        asm("cvt.f32.f16 %0, %1;" : "=f"(r.y) : "h"(hi));
        return r;
    }
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// a and b rounded to the half type (round_if_half of each).
template <int HALF>
__device__ __forceinline__ void round_pair(float& a, float& b) {
    const float2 r = unpack_pair<HALF>(pack_pair<HALF>(a, b));
    a = r.x;
    b = r.y;
}

// The 16 bytes of the eight half-type values p[8 * g .. 8 * g + 8) (p 16-byte aligned).
__device__ __forceinline__ uint4 raw_eight(const unsigned short* p, int g) {
    return reinterpret_cast<const uint4*>(p)[g];
}

// The 8 bytes of the four half-type values p[4 * g .. 4 * g + 4) (p 8-byte aligned).
__device__ __forceinline__ uint2 raw_four(const unsigned short* p, int g) {
    return reinterpret_cast<const uint2*>(p)[g];
}

// The eight values of raw_eight's 16 bytes widened (exactly, as load_value widens).
template <int HALF>
__device__ __forceinline__ Eight widen_eight(const uint4& raw) {
    const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
    Eight out;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 v = unpack_pair<HALF>(w[j]);
        out.v[2 * j] = v.x;
        out.v[2 * j + 1] = v.y;
    }
    return out;
}

// p[i0 .. i0 + 8) = the eight values rounded to the half type, as bit patterns.
template <int HALF>
__device__ __forceinline__ void store_eight_pairs(unsigned short* p, int i0, const Eight& x) {
    uint4 raw;
    raw.x = pack_pair<HALF>(x.v[0], x.v[1]);
    raw.y = pack_pair<HALF>(x.v[2], x.v[3]);
    raw.z = pack_pair<HALF>(x.v[4], x.v[5]);
    raw.w = pack_pair<HALF>(x.v[6], x.v[7]);
    *reinterpret_cast<uint4*>(p + i0) = raw;
}
