/* RMS normalization over the last axis (ai.onnx RMSNormalization, SimplifiedLayerNormalization
 * and com.microsoft SkipSimplifiedLayerNormalization): y = s / sqrt(mean(s^2) + eps) * scale,
 * with s = x, or s = x + skip (+ bias) for the skip form.  The sum of squares runs in double. */
#include <math.h>

#include "kernels.h"
#include "internal.h"

static inline __attribute__((always_inline)) void rms_row_body(
    const float *x, const float *skip, const float *bias, const float *scale, float *y, float *sum,
    float *inv_rms, size_t cols, float epsilon)
{
    const float *s = x;
    if (skip != NULL) {
        /* y holds the sum first (and sum, when asked for), then is normalized in place */
        float *dst = sum != NULL ? sum : y;
        for (size_t j = 0; j < cols; ++j) {
            float v = x[j] + skip[j];
            dst[j] = bias != NULL ? v + bias[j] : v;
        }
        s = dst;
    }
    double ss = 0.0;
    #pragma omp simd reduction(+ : ss)
    for (size_t j = 0; j < cols; ++j) ss += (double)s[j] * (double)s[j];
    float inv = (float)(1.0 / sqrt(ss / (double)cols + (double)epsilon));
    for (size_t j = 0; j < cols; ++j) y[j] = s[j] * inv * scale[j];
    if (inv_rms != NULL) *inv_rms = inv;
}

/* rms_row_body built for each ISA level, chosen by kernels_isa() */
#define RMS_ROW_PARAMS                                                                      \
    (const float *x, const float *skip, const float *bias, const float *scale, float *y,     \
     float *sum, float *inv_rms, size_t cols, float epsilon)
#define RMS_ROW_ARGS (x, skip, bias, scale, y, sum, inv_rms, cols, epsilon)
static void rms_row_portable RMS_ROW_PARAMS { rms_row_body RMS_ROW_ARGS; }
#if defined(__x86_64__)
AVX2 static void rms_row_avx2 RMS_ROW_PARAMS { rms_row_body RMS_ROW_ARGS; }
AVX512 static void rms_row_avx512 RMS_ROW_PARAMS { rms_row_body RMS_ROW_ARGS; }
#endif

static void rms_row RMS_ROW_PARAMS
{
#if defined(__x86_64__)
    if (have_avx512()) {
        rms_row_avx512 RMS_ROW_ARGS;
        return;
    }
    if (have_avx2()) {
        rms_row_avx2 RMS_ROW_ARGS;
        return;
    }
#endif
    rms_row_portable RMS_ROW_ARGS;
}

void rmsnorm_last_f32(const float *x, const float *skip, const float *bias, const float *scale,
                      float *y, float *sum, float *inv_rms, size_t rows, size_t cols,
                      float epsilon)
{
    PARALLEL_FOR(threads_for(rows * cols),
        for (size_t r = 0; r < rows; ++r)
            rms_row(x + r * cols, skip != NULL ? skip + r * cols : NULL, bias, scale, y + r * cols,
                    sum != NULL ? sum + r * cols : NULL, inv_rms != NULL ? inv_rms + r : NULL, cols,
                    epsilon););
}
