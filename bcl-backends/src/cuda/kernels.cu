// BCL's reduction kernels for the cuda backend, compiled once per context with NVRTC.
//
// They reproduce the cpu reference kernels (bcl-backends/src/kernels.rs, dtype.rs) bit for bit:
//  * integers wrap on overflow (computed in the unsigned type of the same width);
//  * fp16 and bf16 compute every operation in fp32 and round back to nearest even;
//  * min/max on floats are IEEE minNum/maxNum (fminf/fmaxf: a NaN loses against a number);
//  * avg runs as sum, then one division by the number of ranks (integers truncate).
// No headers: NVRTC compiles this file alone, with no CUDA toolkit installed.

typedef unsigned long long u64;

struct f16 { unsigned short bits; };
struct bf16 { unsigned short bits; };

__device__ __forceinline__ float to_f32(f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
}
__device__ __forceinline__ f16 from_f32_h(float f) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}
__device__ __forceinline__ float to_f32(bf16 b) {
    return __uint_as_float(((unsigned int)b.bits) << 16);
}
// The `half` crate's rounding, step for step: NaN stays a quiet NaN, else round to nearest even.
__device__ __forceinline__ bf16 from_f32_b(float f) {
    unsigned int x = __float_as_uint(f);
    bf16 b;
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        b.bits = (unsigned short)((x >> 16) | 0x0040u);
        return b;
    }
    const unsigned int round_bit = 0x00008000u;
    if ((x & round_bit) != 0 && (x & (3u * round_bit - 1u)) != 0) {
        b.bits = (unsigned short)((x >> 16) + 1u);
    } else {
        b.bits = (unsigned short)(x >> 16);
    }
    return b;
}

template <typename T, typename U> struct IntOps {
    static __device__ __forceinline__ T sum(T a, T b) { return (T)(U)((U)a + (U)b); }
    static __device__ __forceinline__ T prod(T a, T b) { return (T)(U)((U)a * (U)b); }
    static __device__ __forceinline__ T min(T a, T b) { return b < a ? b : a; }
    static __device__ __forceinline__ T max(T a, T b) { return a < b ? b : a; }
    static __device__ __forceinline__ T divide(T a, u64 n) { return a / (T)n; }
};

struct F32Ops {
    static __device__ __forceinline__ float sum(float a, float b) { return __fadd_rn(a, b); }
    static __device__ __forceinline__ float prod(float a, float b) { return __fmul_rn(a, b); }
    static __device__ __forceinline__ float min(float a, float b) { return fminf(a, b); }
    static __device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
    static __device__ __forceinline__ float divide(float a, u64 n) { return __fdiv_rn(a, (float)n); }
};

struct F64Ops {
    static __device__ __forceinline__ double sum(double a, double b) { return __dadd_rn(a, b); }
    static __device__ __forceinline__ double prod(double a, double b) { return __dmul_rn(a, b); }
    static __device__ __forceinline__ double min(double a, double b) { return fmin(a, b); }
    static __device__ __forceinline__ double max(double a, double b) { return fmax(a, b); }
    static __device__ __forceinline__ double divide(double a, u64 n) { return __ddiv_rn(a, (double)n); }
};

#define HALF_OPS(NAME, T, FROM)                                                                    \
    struct NAME {                                                                                  \
        static __device__ __forceinline__ T sum(T a, T b) { return FROM(__fadd_rn(to_f32(a), to_f32(b))); } \
        static __device__ __forceinline__ T prod(T a, T b) { return FROM(__fmul_rn(to_f32(a), to_f32(b))); } \
        static __device__ __forceinline__ T min(T a, T b) { return FROM(fminf(to_f32(a), to_f32(b))); } \
        static __device__ __forceinline__ T max(T a, T b) { return FROM(fmaxf(to_f32(a), to_f32(b))); } \
        static __device__ __forceinline__ T divide(T a, u64 n) { return FROM(__fdiv_rn(to_f32(a), (float)n)); } \
    };
HALF_OPS(F16Ops, f16, from_f32_h)
HALF_OPS(BF16Ops, bf16, from_f32_b)

#define OP_SUM(Ops) Ops::sum
#define OP_PROD(Ops) Ops::prod
#define OP_MIN(Ops) Ops::min
#define OP_MAX(Ops) Ops::max

// dst[i] = dst[i] (op) src[i] for i < n. Where both pointers are 16-byte aligned the bulk moves
// as 16-byte vectors (one load of each side and one store per thread and step); the tail, and
// misaligned buffers, element by element.
#define REDUCE_KERNEL(NAME, T, Ops, OP)                                                            \
    extern "C" __global__ void NAME(T* dst, const T* src, u64 n) {                                 \
        const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;                                \
        const u64 stride = (u64)gridDim.x * blockDim.x;                                            \
        const int per = 16 / (int)sizeof(T);                                                      \
        u64 vectors = 0;                                                                           \
        if ((((u64)dst | (u64)src) & 15) == 0) {                                                   \
            vectors = n / per;                                                                     \
            union V { uint4 v; T e[16 / sizeof(T)]; };                                             \
            V* d = (V*)dst;                                                                        \
            const V* s = (const V*)src;                                                            \
            for (u64 i = tid; i < vectors; i += stride) {                                          \
                V a = d[i];                                                                        \
                const V b = s[i];                                                                  \
                _Pragma("unroll") for (int k = 0; k < per; k++) a.e[k] = OP(Ops)(a.e[k], b.e[k]); \
                d[i] = a;                                                                          \
            }                                                                                      \
        }                                                                                          \
        for (u64 i = vectors * per + tid; i < n; i += stride) dst[i] = OP(Ops)(dst[i], src[i]);   \
    }

#define DIVIDE_KERNEL(NAME, T, Ops)                                                                \
    extern "C" __global__ void NAME(T* dst, u64 n, u64 divisor) {                                  \
        const u64 stride = (u64)gridDim.x * blockDim.x;                                            \
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)               \
            dst[i] = Ops::divide(dst[i], divisor);                                                 \
    }

#define DTYPE(NAME, T, Ops)                                                                        \
    REDUCE_KERNEL(bcl_reduce_##NAME##_sum, T, Ops, OP_SUM)                                         \
    REDUCE_KERNEL(bcl_reduce_##NAME##_prod, T, Ops, OP_PROD)                                       \
    REDUCE_KERNEL(bcl_reduce_##NAME##_min, T, Ops, OP_MIN)                                         \
    REDUCE_KERNEL(bcl_reduce_##NAME##_max, T, Ops, OP_MAX)                                         \
    DIVIDE_KERNEL(bcl_divide_##NAME, T, Ops)

typedef IntOps<signed char, unsigned char> I8Ops;
typedef IntOps<unsigned char, unsigned char> U8Ops;
typedef IntOps<int, unsigned int> I32Ops;
typedef IntOps<unsigned int, unsigned int> U32Ops;
typedef IntOps<long long, unsigned long long> I64Ops;
typedef IntOps<unsigned long long, unsigned long long> U64Ops;

DTYPE(int8, signed char, I8Ops)
DTYPE(uint8, unsigned char, U8Ops)
DTYPE(int32, int, I32Ops)
DTYPE(uint32, unsigned int, U32Ops)
DTYPE(int64, long long, I64Ops)
DTYPE(uint64, unsigned long long, U64Ops)
DTYPE(half, f16, F16Ops)
DTYPE(bfloat16, bf16, BF16Ops)
DTYPE(float, float, F32Ops)
DTYPE(double, double, F64Ops)
