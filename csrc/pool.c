#include <math.h>

#include "kernels.h"
#include "internal.h"

void maxpool2d_f32(const float *x, int planes, int in_h, int in_w, float *y, int out_h,
                   int out_w, int k_h, int k_w, int stride_h, int stride_w, int pad_top,
                   int pad_left, int dil_h, int dil_w)
{
    size_t out_plane = (size_t)out_h * out_w, in_plane = (size_t)in_h * in_w;
    #pragma omp parallel for num_threads(threads_for((size_t)planes * out_plane * k_h * k_w)) \
        schedule(static)
    for (int p = 0; p < planes; ++p) {
        const float *xp = x + (size_t)p * in_plane;
        float *yp = y + (size_t)p * out_plane;
        for (int oy = 0; oy < out_h; ++oy) {
            int y0 = oy * stride_h - pad_top, fy, ly;
            taps_inside(y0, k_h, dil_h, 0, in_h, &fy, &ly);
            for (int ox = 0; ox < out_w; ++ox) {
                int x0 = ox * stride_w - pad_left, fx, lx;
                taps_inside(x0, k_w, dil_w, 0, in_w, &fx, &lx);
                float m = -INFINITY;
                for (int ky = fy; ky < ly; ++ky) {
                    const float *row = xp + (size_t)(y0 + ky * dil_h) * in_w;
                    for (int kx = fx; kx < lx; ++kx) {
                        float v = row[x0 + kx * dil_w];
                        if (v > m || v != v) m = v;
                        if (m != m) break;
                    }
                }
                yp[(size_t)oy * out_w + ox] = m;
            }
        }
    }
}

void avgpool2d_f32(const float *x, int planes, int in_h, int in_w, float *y, int out_h,
                   int out_w, int k_h, int k_w, int stride_h, int stride_w, int pad_top,
                   int pad_left, int pad_bottom, int pad_right, int dil_h, int dil_w,
                   int count_include_pad)
{
    size_t out_plane = (size_t)out_h * out_w, in_plane = (size_t)in_h * in_w;
    #pragma omp parallel for num_threads(threads_for((size_t)planes * out_plane * k_h * k_w)) \
        schedule(static)
    for (int p = 0; p < planes; ++p) {
        const float *xp = x + (size_t)p * in_plane;
        float *yp = y + (size_t)p * out_plane;
        for (int oy = 0; oy < out_h; ++oy) {
            int y0 = oy * stride_h - pad_top, fy, ly, py0, py1;
            taps_inside(y0, k_h, dil_h, 0, in_h, &fy, &ly);
            taps_inside(y0, k_h, dil_h, -pad_top, in_h + pad_bottom, &py0, &py1);
            for (int ox = 0; ox < out_w; ++ox) {
                int x0 = ox * stride_w - pad_left, fx, lx, px0, px1;
                taps_inside(x0, k_w, dil_w, 0, in_w, &fx, &lx);
                taps_inside(x0, k_w, dil_w, -pad_left, in_w + pad_right, &px0, &px1);
                float sum = 0.0f;
                for (int ky = fy; ky < ly; ++ky) {
                    const float *row = xp + (size_t)(y0 + ky * dil_h) * in_w;
                    for (int kx = fx; kx < lx; ++kx)
                        sum += row[x0 + kx * dil_w];
                }
                int count = count_include_pad ? (py1 - py0) * (px1 - px0) : (ly - fy) * (lx - fx);
                yp[(size_t)oy * out_w + ox] = sum / (float)count;
            }
        }
    }
}
