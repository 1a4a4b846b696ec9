/* Pooling tap by tap over whole output rows (as the depthwise convolution does), so the inner
 * loop runs along x and vectorises; window bounds are worked out once per row and column. */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "internal.h"

/* Per kernel column kx, the output columns [lo, hi) whose tap kx lands inside the input. */
static int *column_ranges(int k_w, int stride_w, int pad_left, int dil_w, int in_w, int out_w)
{
    int *inside = malloc(sizeof(int) * 2 * (k_w > 0 ? k_w : 1));
    if (inside != NULL)
        for (int kx = 0; kx < k_w; ++kx)
            inside_range(kx * dil_w - pad_left, stride_w, in_w, out_w, &inside[2 * kx],
                         &inside[2 * kx + 1]);
    return inside;
}

VECTOR_CLONES
static void max_taps(float *restrict yrow, const float *restrict row, int stride, int x0, int lo,
                     int hi)
{
    /* NaN propagates: once yrow holds NaN, no v replaces it; a NaN v always does */
    for (int o = lo; o < hi; ++o) {
        float v = row[o * stride + x0], m = yrow[o];
        yrow[o] = (v > m || v != v) ? v : m;
    }
}

VECTOR_CLONES
static void sum_taps(float *restrict yrow, const float *restrict row, int stride, int x0, int lo,
                     int hi)
{
    for (int o = lo; o < hi; ++o) yrow[o] += row[o * stride + x0];
}

int maxpool2d_f32(const float *x, int planes, int in_h, int in_w, float *y, int out_h,
                  int out_w, int k_h, int k_w, int stride_h, int stride_w, int pad_top,
                  int pad_left, int dil_h, int dil_w)
{
    int *inside = column_ranges(k_w, stride_w, pad_left, dil_w, in_w, out_w);
    if (inside == NULL)
        return -1;
    size_t out_plane = (size_t)out_h * out_w, in_plane = (size_t)in_h * in_w;
    #pragma omp parallel for num_threads(threads_for((size_t)planes * out_plane * k_h * k_w)) \
        schedule(static)
    for (int p = 0; p < planes; ++p) {
        const float *xp = x + (size_t)p * in_plane;
        for (int oy = 0; oy < out_h; ++oy) {
            float *yrow = y + (size_t)p * out_plane + (size_t)oy * out_w;
            int y0 = oy * stride_h - pad_top, fy, ly;
            taps_inside(y0, k_h, dil_h, 0, in_h, &fy, &ly);
            for (int ox = 0; ox < out_w; ++ox) yrow[ox] = -INFINITY;
            for (int ky = fy; ky < ly; ++ky) {
                const float *row = xp + (size_t)(y0 + ky * dil_h) * in_w;
                for (int kx = 0; kx < k_w; ++kx)
                    max_taps(yrow, row, stride_w, kx * dil_w - pad_left, inside[2 * kx],
                             inside[2 * kx + 1]);
            }
        }
    }
    free(inside);
    return 0;
}

int avgpool2d_f32(const float *x, int planes, int in_h, int in_w, float *y, int out_h,
                  int out_w, int k_h, int k_w, int stride_h, int stride_w, int pad_top,
                  int pad_left, int pad_bottom, int pad_right, int dil_h, int dil_w,
                  int count_include_pad)
{
    int *inside = column_ranges(k_w, stride_w, pad_left, dil_w, in_w, out_w);
    int *cols = malloc(sizeof(int) * (out_w > 0 ? out_w : 1)); /* taps counted per column */
    if (inside == NULL || cols == NULL) {
        free(inside);
        free(cols);
        return -1;
    }
    for (int ox = 0; ox < out_w; ++ox) {
        int x0 = ox * stride_w - pad_left, f, l;
        if (count_include_pad)
            taps_inside(x0, k_w, dil_w, -pad_left, in_w + pad_right, &f, &l);
        else
            taps_inside(x0, k_w, dil_w, 0, in_w, &f, &l);
        cols[ox] = l - f;
    }
    size_t out_plane = (size_t)out_h * out_w, in_plane = (size_t)in_h * in_w;
    #pragma omp parallel for num_threads(threads_for((size_t)planes * out_plane * k_h * k_w)) \
        schedule(static)
    for (int p = 0; p < planes; ++p) {
        const float *xp = x + (size_t)p * in_plane;
        for (int oy = 0; oy < out_h; ++oy) {
            float *yrow = y + (size_t)p * out_plane + (size_t)oy * out_w;
            int y0 = oy * stride_h - pad_top, fy, ly, py0, py1;
            taps_inside(y0, k_h, dil_h, 0, in_h, &fy, &ly);
            taps_inside(y0, k_h, dil_h, -pad_top, in_h + pad_bottom, &py0, &py1);
            int rows = count_include_pad ? py1 - py0 : ly - fy;
            for (int ox = 0; ox < out_w; ++ox) yrow[ox] = 0.0f;
            for (int ky = fy; ky < ly; ++ky) {
                const float *row = xp + (size_t)(y0 + ky * dil_h) * in_w;
                for (int kx = 0; kx < k_w; ++kx)
                    sum_taps(yrow, row, stride_w, kx * dil_w - pad_left, inside[2 * kx],
                             inside[2 * kx + 1]);
            }
            for (int ox = 0; ox < out_w; ++ox) yrow[ox] /= (float)(rows * cols[ox]);
        }
    }
    free(inside);
    free(cols);
    return 0;
}
