/* Rotary position embedding: each pair of a row's first `rot` values turns by its angle,
 * y_a = x_a cos - x_b sin, y_b = x_b cos + x_a sin, pairs (j, j + rot/2) (the rotate_half
 * form) or (2j, 2j + 1) (interleaved).  cos/sin hold one value per element of the rotated part
 * (full width, as exporters compute cat(freqs, freqs).cos()) or one per pair (half width, the
 * com.microsoft RotaryEmbedding caches).  Products are rounded before the sum, as the
 * decomposed graph rounds them (the build contracts no a * b + c into an FMA). */
#include "kernels.h"
#include "internal.h"

VECTOR_CLONES
static void rotate_halves(const float *x, const float *c, const float *s, float *y,
                          int64_t half, int full_width)
{
    const float *c_hi = full_width ? c + half : c, *s_hi = full_width ? s + half : s;
    for (int64_t j = 0; j < half; ++j) {
        float a = x[j], b = x[j + half];
        float lo = a * c[j] + (-b) * s[j];
        float hi = b * c_hi[j] + a * s_hi[j];
        y[j] = lo;
        y[j + half] = hi;
    }
}

static void rotate_pairs(const float *x, const float *c, const float *s, float *y,
                         int64_t half, int full_width)
{
    for (int64_t j = 0; j < half; ++j) {
        float a = x[2 * j], b = x[2 * j + 1];
        int64_t ca = full_width ? 2 * j : j, cb = full_width ? 2 * j + 1 : j;
        float lo = a * c[ca] + (-b) * s[ca];
        float hi = b * c[cb] + a * s[cb];
        y[2 * j] = lo;
        y[2 * j + 1] = hi;
    }
}

void rotary_f32(const float *x, const float *cos, const float *sin, float *y, int64_t d0,
                int64_t d1, int64_t d2, int64_t head, int64_t rot, const int64_t *cos_strides,
                int full_width, int interleaved)
{
    int64_t rows = d0 * d1 * d2, half = rot / 2;
    PARALLEL_FOR(threads_for((size_t)rows * head), for (int64_t r = 0; r < rows; ++r) {
        int64_t i0 = r / (d1 * d2), i1 = (r / d2) % d1, i2 = r % d2;
        int64_t at = i0 * cos_strides[0] + i1 * cos_strides[1] + i2 * cos_strides[2];
        const float *xr = x + r * head;
        float *yr = y + r * head;
        if (interleaved)
            rotate_pairs(xr, cos + at, sin + at, yr, half, full_width);
        else
            rotate_halves(xr, cos + at, sin + at, yr, half, full_width);
        if (yr != xr)
            for (int64_t j = 2 * half; j < head; ++j) yr[j] = xr[j];
    });
}
