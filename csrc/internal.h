/* Helpers shared by the kernel sources; not part of the cffi interface. */
#ifndef KERNELS_INTERNAL_H
#define KERNELS_INTERNAL_H
#include <stddef.h>

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

/* Row-major C = alpha * op(A) op(B) + beta * C on the calling thread (M=1 or N=1: GEMV). */
void gemm_block(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* Row-major C = alpha * op(A) op(B) + beta * C, split across the OpenMP threads in
 * independent blocks; BLAS runs single-threaded in each. */
void gemm_parallel(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* y[i] = act(y[i]) in place. */
void activate_inplace(float *y, size_t n, int act, float alpha, float beta);

/* Window taps [first, last) along one axis that land inside [lo, hi). */
static inline void taps_inside(int start, int kernel, int dil, int lo, int hi, int *first, int *last)
{
    int f = 0, l = kernel;
    while (f < kernel && start + f * dil < lo) ++f;
    while (l > f && start + (l - 1) * dil >= hi) --l;
    *first = f;
    *last = l;
}

/* Output positions [lo, hi) along one axis whose input index o * stride + offset lies in
 * [0, in_size); positions outside read padding. */
static inline void inside_range(int offset, int stride, int in_size, int out_size, int *lo,
                                int *hi)
{
    int l = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
    int last = in_size - 1 - offset;
    int h = last < 0 ? 0 : last / stride + 1;
    l = l < out_size ? l : out_size;
    h = h < out_size ? h : out_size;
    *lo = l;
    *hi = h > l ? h : l;
}

#endif
