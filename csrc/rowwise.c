/* Kernels over the last axis of a (rows x cols) array: reductions, softmax, layer norm. */
#include <math.h>

#include "kernels.h"
#include "internal.h"
#include "vmath.h"

static inline float row_reduce(int kind, const float *x, size_t cols)
{
    if (kind == RED_MAX) {
        float m = -INFINITY;
        for (size_t j = 0; j < cols; ++j) {
            float v = x[j];
            if (v > m || v != v) m = v;
        }
        return m;
    }
    /* sixteen running sums, not one latency-bound chain (4 cycles an add): GlobalAveragePool
     * over 1000 x 169 took 156 us on one chain, 34 us on these */
    double lane[16] = {0};
    size_t j = 0;
    for (; j + 16 <= cols; j += 16)
        for (int k = 0; k < 16; ++k) lane[k] += x[j + k];
    for (int k = 0; k < 8; ++k) lane[k] += lane[k + 8];
    double s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    for (; j < cols; ++j) s += x[j];
    return (float)(kind == RED_MEAN ? s / (double)cols : s);
}

VECTOR_CLONES
void reduce_last_f32(int kind, const float *x, float *y, size_t rows, size_t cols)
{
    PARALLEL_FOR(threads_for(rows * cols),
        for (size_t r = 0; r < rows; ++r)
            y[r] = row_reduce(kind, x + r * cols, cols););
}

VECTOR_CLONES
static void softmax_rows(const float *x, float *y, size_t rows, size_t cols)
{
    PARALLEL_FOR(threads_for(rows * cols),
        for (size_t r = 0; r < rows; ++r) {
            const float *xr = x + r * cols;
            float *yr = y + r * cols;
            float m = row_reduce(RED_MAX, xr, cols);
            for (size_t j = 0; j < cols; ++j)
                yr[j] = vm_exp(xr[j] - m);
            float s = 0.0f;
            _Pragma("omp simd reduction(+ : s)")
            for (size_t j = 0; j < cols; ++j)
                s += yr[j];
            float inv = 1.0f / s;
            for (size_t j = 0; j < cols; ++j) yr[j] *= inv;
        });
}

#if defined(__x86_64__)
AVX512 static void softmax_rows_avx512(const float *x, float *y, size_t rows, size_t cols)
{
    PARALLEL_FOR(threads_for(rows * cols),
        for (size_t r = 0; r < rows; ++r)
            vm512_softmax_row(x + r * cols, y + r * cols, cols););
}
#endif

void softmax_last_f32(const float *x, float *y, size_t rows, size_t cols)
{
#if defined(__x86_64__)
    if (have_avx512()) {
        softmax_rows_avx512(x, y, rows, cols);
        return;
    }
#endif
    softmax_rows(x, y, rows, cols);
}

/* One row's mean and 1 / sqrt(variance + epsilon), each sum in vector lanes of doubles, not one
 * latency-bound chain: 70 -> 24 us for bert's 128 x 256 rows on one thread (the 4-cycle add
 * chain set the pace). */
static inline __attribute__((always_inline)) void row_moments(const float *xr, size_t cols,
                                                              float epsilon, float *mean,
                                                              float *inv_std)
{
    double s = 0.0, ss = 0.0;
    _Pragma("omp simd reduction(+ : s)")
    for (size_t j = 0; j < cols; ++j) s += xr[j];
    double mu = s / (double)cols;
    _Pragma("omp simd reduction(+ : ss)")
    for (size_t j = 0; j < cols; ++j) {
        double d = xr[j] - mu;
        ss += d * d;
    }
    *mean = (float)mu;
    *inv_std = (float)(1.0 / sqrt(ss / (double)cols + (double)epsilon));
}

static inline __attribute__((always_inline)) void layernorm_rows(
    const float *x, const float *scale, const float *bias, float *y, float *mean, float *inv_std,
    size_t rows, size_t cols, float epsilon)
{
    PARALLEL_FOR(threads_for(rows * cols),
        for (size_t r = 0; r < rows; ++r) {
            const float *xr = x + r * cols;
            float *yr = y + r * cols;
            float m, inv;
            row_moments(xr, cols, epsilon, &m, &inv);
            for (size_t j = 0; j < cols; ++j) {
                float v = (xr[j] - m) * inv * scale[j];
                yr[j] = bias != NULL ? v + bias[j] : v;
            }
            if (mean != NULL) mean[r] = m;
            if (inv_std != NULL) inv_std[r] = inv;
        });
}

static void layernorm_portable(const float *x, const float *scale, const float *bias, float *y,
                               float *mean, float *inv_std, size_t rows, size_t cols, float epsilon)
{
    layernorm_rows(x, scale, bias, y, mean, inv_std, rows, cols, epsilon);
}

#if defined(__x86_64__)
AVX2 static void layernorm_avx2(const float *x, const float *scale, const float *bias, float *y,
                                float *mean, float *inv_std, size_t rows, size_t cols,
                                float epsilon)
{
    layernorm_rows(x, scale, bias, y, mean, inv_std, rows, cols, epsilon);
}

/* x[j..j+16) as two vectors of doubles, lanes past `valid` 0. */
AVX512 static inline void load_doubles(const float *x, size_t valid, __m512d *lo, __m512d *hi)
{
    __m512 v = valid >= 16 ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(vm512_head(valid), x);
    *lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    *hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* row_moments 16 floats a step: both sums in double, as the other paths keep them. */
AVX512 static void row_moments_avx512(const float *xr, size_t cols, float epsilon, float *mean,
                                      float *inv_std)
{
    __m512d s_lo = _mm512_setzero_pd(), s_hi = _mm512_setzero_pd(), lo, hi;
    for (size_t j = 0; j < cols; j += 16) {
        load_doubles(xr + j, cols - j, &lo, &hi);
        s_lo = _mm512_add_pd(s_lo, lo);
        s_hi = _mm512_add_pd(s_hi, hi);
    }
    double mu = _mm512_reduce_add_pd(_mm512_add_pd(s_lo, s_hi)) / (double)cols;
    __m512d q_lo = _mm512_setzero_pd(), q_hi = _mm512_setzero_pd(), m = _mm512_set1_pd(mu);
    for (size_t j = 0; j < cols; j += 16) {
        load_doubles(xr + j, cols - j, &lo, &hi);
        /* lanes past the row read 0: their (0 - mu)^2 is masked off */
        size_t valid = cols - j;
        __mmask8 keep_lo = valid >= 8 ? 0xff : (__mmask8)((1u << valid) - 1u);
        __mmask8 keep_hi = valid >= 16 ? 0xff
                           : valid <= 8 ? 0 : (__mmask8)((1u << (valid - 8)) - 1u);
        lo = _mm512_maskz_sub_pd(keep_lo, lo, m);
        hi = _mm512_maskz_sub_pd(keep_hi, hi, m);
        q_lo = _mm512_fmadd_pd(lo, lo, q_lo);
        q_hi = _mm512_fmadd_pd(hi, hi, q_hi);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(q_lo, q_hi));
    *mean = (float)mu;
    *inv_std = (float)(1.0 / sqrt(ss / (double)cols + (double)epsilon));
}

AVX512 static void layernorm_avx512(const float *x, const float *scale, const float *bias,
                                    float *y, float *mean, float *inv_std, size_t rows,
                                    size_t cols, float epsilon)
{
    PARALLEL_FOR(threads_for(rows * cols),
        for (size_t r = 0; r < rows; ++r) {
            const float *xr = x + r * cols;
            float *yr = y + r * cols;
            float m, inv;
            row_moments_avx512(xr, cols, epsilon, &m, &inv);
            __m512 vm = _mm512_set1_ps(m), vi = _mm512_set1_ps(inv);
            for (size_t j = 0; j < cols; j += 16) {
                __mmask16 h = cols - j >= 16 ? 0xffff : vm512_head(cols - j);
                /* rounded as the other paths round: ((x - m) * inv) * scale + bias */
                __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(h, xr + j), vm), vi);
                v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(h, scale + j));
                if (bias != NULL) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(h, bias + j));
                _mm512_mask_storeu_ps(yr + j, h, v);
            }
            if (mean != NULL) mean[r] = m;
            if (inv_std != NULL) inv_std[r] = inv;
        });
}
#endif

void layernorm_last_f32(const float *x, const float *scale, const float *bias, float *y,
                        float *mean, float *inv_std, size_t rows, size_t cols, float epsilon)
{
#if defined(__x86_64__)
    if (have_avx512()) {
        layernorm_avx512(x, scale, bias, y, mean, inv_std, rows, cols, epsilon);
        return;
    }
    if (have_avx2()) {
        layernorm_avx2(x, scale, bias, y, mean, inv_std, rows, cols, epsilon);
        return;
    }
#endif
    layernorm_portable(x, scale, bias, y, mean, inv_std, rows, cols, epsilon);
}
