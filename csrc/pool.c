/* Pooling tap by tap over whole output rows (as the depthwise convolution does), so the inner
 * loop runs along x and vectorises; window bounds are worked out once per row and column. */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "internal.h"

/* Per kernel column kx, the output columns [lo, hi) whose tap kx lands inside the input. */
static int64_t *column_ranges(int64_t k_w, int64_t stride_w, int64_t pad_left, int64_t dil_w,
                              int64_t in_w, int64_t out_w)
{
    int64_t *inside = malloc(sizeof(int64_t) * 2 * (size_t)(k_w > 0 ? k_w : 1));
    if (inside != NULL)
        for (int64_t kx = 0; kx < k_w; ++kx)
            inside_range(kx * dil_w - pad_left, stride_w, in_w, out_w, &inside[2 * kx],
                         &inside[2 * kx + 1]);
    return inside;
}

VECTOR_CLONES
static void max_taps(float *restrict yrow, const float *restrict row, int64_t stride, int64_t x0,
                     int64_t lo, int64_t hi)
{
    /* NaN propagates: once yrow holds NaN, no v replaces it; a NaN v always does */
    for (int64_t o = lo; o < hi; ++o) {
        float v = row[o * stride + x0], m = yrow[o];
        yrow[o] = (v > m || v != v) ? v : m;
    }
}

VECTOR_CLONES
static void sum_taps(float *restrict yrow, const float *restrict row, int64_t stride, int64_t x0,
                     int64_t lo, int64_t hi)
{
    for (int64_t o = lo; o < hi; ++o) yrow[o] += row[o * stride + x0];
}

int maxpool2d_f32(const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
                  int64_t out_h, int64_t out_w, int64_t k_h, int64_t k_w, int64_t stride_h,
                  int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t dil_h,
                  int64_t dil_w)
{
    int64_t *inside = column_ranges(k_w, stride_w, pad_left, dil_w, in_w, out_w);
    if (inside == NULL)
        return -1;
    size_t out_plane = (size_t)out_h * out_w, in_plane = (size_t)in_h * in_w;
    #pragma omp parallel for num_threads(threads_for((size_t)planes * out_plane * k_h * k_w)) \
        schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
        const float *xp = x + (size_t)p * in_plane;
        for (int64_t oy = 0; oy < out_h; ++oy) {
            float *yrow = y + (size_t)p * out_plane + (size_t)oy * out_w;
            int64_t y0 = oy * stride_h - pad_top, fy, ly;
            taps_inside(y0, k_h, dil_h, 0, in_h, &fy, &ly);
            for (int64_t ox = 0; ox < out_w; ++ox) yrow[ox] = -INFINITY;
            for (int64_t ky = fy; ky < ly; ++ky) {
                const float *row = xp + (size_t)(y0 + ky * dil_h) * in_w;
                for (int64_t kx = 0; kx < k_w; ++kx)
                    max_taps(yrow, row, stride_w, kx * dil_w - pad_left, inside[2 * kx],
                             inside[2 * kx + 1]);
            }
        }
    }
    free(inside);
    return 0;
}

int avgpool2d_f32(const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
                  int64_t out_h, int64_t out_w, int64_t k_h, int64_t k_w, int64_t stride_h,
                  int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t pad_bottom,
                  int64_t pad_right, int64_t dil_h, int64_t dil_w, int count_include_pad)
{
    int64_t *inside = column_ranges(k_w, stride_w, pad_left, dil_w, in_w, out_w);
    /* taps counted per column; a row's count times a column's can pass 2^31 */
    int64_t *cols = malloc(sizeof(int64_t) * (size_t)(out_w > 0 ? out_w : 1));
    if (inside == NULL || cols == NULL) {
        free(inside);
        free(cols);
        return -1;
    }
    for (int64_t ox = 0; ox < out_w; ++ox) {
        int64_t x0 = ox * stride_w - pad_left, f, l;
        if (count_include_pad)
            taps_inside(x0, k_w, dil_w, -pad_left, in_w + pad_right, &f, &l);
        else
            taps_inside(x0, k_w, dil_w, 0, in_w, &f, &l);
        cols[ox] = l - f;
    }
    size_t out_plane = (size_t)out_h * out_w, in_plane = (size_t)in_h * in_w;
    #pragma omp parallel for num_threads(threads_for((size_t)planes * out_plane * k_h * k_w)) \
        schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
        const float *xp = x + (size_t)p * in_plane;
        for (int64_t oy = 0; oy < out_h; ++oy) {
            float *yrow = y + (size_t)p * out_plane + (size_t)oy * out_w;
            int64_t y0 = oy * stride_h - pad_top, fy, ly, py0, py1;
            taps_inside(y0, k_h, dil_h, 0, in_h, &fy, &ly);
            taps_inside(y0, k_h, dil_h, -pad_top, in_h + pad_bottom, &py0, &py1);
            int64_t rows = count_include_pad ? py1 - py0 : ly - fy;
            for (int64_t ox = 0; ox < out_w; ++ox) yrow[ox] = 0.0f;
            for (int64_t ky = fy; ky < ly; ++ky) {
                const float *row = xp + (size_t)(y0 + ky * dil_h) * in_w;
                for (int64_t kx = 0; kx < k_w; ++kx)
                    sum_taps(yrow, row, stride_w, kx * dil_w - pad_left, inside[2 * kx],
                             inside[2 * kx + 1]);
            }
            for (int64_t ox = 0; ox < out_w; ++ox) yrow[ox] /= (float)((double)rows * cols[ox]);
        }
    }
    free(inside);
    free(cols);
    return 0;
}
