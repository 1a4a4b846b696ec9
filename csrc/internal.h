/* Helpers shared by the kernel sources; not part of the cffi interface. */
#ifndef KERNELS_INTERNAL_H
#define KERNELS_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* Hot loops built twice, for AVX2+FMA (x86-64-v3) and for the baseline, picked at load time:
 * the extension is built once per install but must run on any x86-64. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define VECTOR_CLONES
#endif

/* Threads for a loop over `work` elements: below a few thousand, a parallel region costs more
 * than it saves. */
int threads_for(size_t work);

/* PARALLEL_FOR(threads, for (...) body): the loop split statically across `threads` OpenMP
 * threads, or run on the calling thread without entering OpenMP when threads is 1.  Entering
 * a parallel region costs about 0.4 us even for a team of one, more than a small kernel's whole
 * work (a plan's step table runs many of those back to back).  The body may not hold a
 * #pragma line (write _Pragma("...") instead). */
#define PARALLEL_FOR(threads, ...)                                                         \
    do {                                                                                   \
        int parallel_for_threads_ = (threads);                                             \
        if (parallel_for_threads_ > 1) {                                                   \
            _Pragma("omp parallel for num_threads(parallel_for_threads_) schedule(static)") \
            __VA_ARGS__                                                                    \
        } else {                                                                           \
            __VA_ARGS__                                                                    \
        }                                                                                  \
    } while (0)

/* Row-major C = alpha * op(A) op(B) + beta * C on the calling thread (M=1 or N=1: GEMV). */
void gemm_block(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* Row-major C = alpha * op(A) op(B) + beta * C, split across the OpenMP threads in
 * independent blocks; BLAS runs single-threaded in each. */
void gemm_parallel(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* MatMulNBits's 4-bit weight rows (row_bytes apart, padding past the codes left as it is)
 * from k x n DequantizeLinear codes, n even (csrc/nbits_pack.c); flip XORs each code. */
void matmul_nbits_pack4_pairs(const uint8_t *src, uint8_t *dst, int k, int n, size_t row_bytes,
                              uint8_t flip);
/* MatMulNBits's 8-bit weight rows from k x n codes: a byte transpose (csrc/nbits_pack.c). */
void matmul_nbits_pack8_rows(const uint8_t *src, uint8_t *dst, int k, int n, size_t row_bytes,
                             uint8_t flip);

/* y[i] = act(y[i]) in place. */
void activate_inplace(float *y, size_t n, int act, float alpha, float beta);

/* Window geometry is int64_t throughout: a dimension, pad, stride or dilation may each be up
 * to the largest int32, and their sums and products (a dilated window's span, o * stride +
 * offset) then exceed 32 bits. */

/* Window taps [first, last) along one axis that land inside [lo, hi): tap t sits at
 * start + t * dil. */
static inline void taps_inside(int64_t start, int64_t kernel, int64_t dil, int64_t lo, int64_t hi,
                               int64_t *first, int64_t *last)
{
    int64_t f = start >= lo ? 0 : (lo - start + dil - 1) / dil; /* first tap at or after lo */
    int64_t l = start >= hi ? 0 : (hi - 1 - start) / dil + 1;   /* taps before hi */
    if (f > kernel) f = kernel;
    if (l > kernel) l = kernel;
    *first = f;
    *last = l > f ? l : f;
}

/* Output positions [lo, hi) along one axis whose input index o * stride + offset lies in
 * [0, in_size); positions outside read padding. */
static inline void inside_range(int64_t offset, int64_t stride, int64_t in_size, int64_t out_size,
                                int64_t *lo, int64_t *hi)
{
    int64_t l = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
    int64_t last = in_size - 1 - offset;
    int64_t h = last < 0 ? 0 : last / stride + 1;
    l = l < out_size ? l : out_size;
    h = h < out_size ? h : out_size;
    *lo = l;
    *hi = h > l ? h : l;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* Functions built for AVX2 and FMA, or for AVX-512 (F, BW, DQ, VL; FMA comes with F), called
 * only after a runtime check: kernels_isa() in threads.c. */
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))

/* Whether kernels may run AVX2 and FMA code: the CPU has it and kernels_limit_isa allows it. */
static inline int have_avx2(void)
{
    return kernels_isa() >= ISA_AVX2;
}

/* Whether kernels may run AVX-512 code (F, BW, DQ, VL). */
static inline int have_avx512(void)
{
    return kernels_isa() >= ISA_AVX512;
}

/* The sum of the 8 lanes. */
AVX2 static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#endif
