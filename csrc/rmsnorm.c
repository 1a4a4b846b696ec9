/* RMS normalization over the last axis (ai.onnx RMSNormalization, SimplifiedLayerNormalization
 * and com.microsoft SkipSimplifiedLayerNormalization): y = s / sqrt(mean(s^2) + eps) * scale,
 * with s = x, or s = x + skip (+ bias) for the skip form.  The sum of squares runs in double. */
#include <math.h>

#include "kernels.h"
#include "internal.h"

VECTOR_CLONES
static void rms_row(const float *x, const float *skip, const float *bias, const float *scale,
                    float *y, float *sum, float *inv_rms, size_t cols, float epsilon)
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
