#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"
#include "conv_internal.h"


/* Columns [start, start + count) of the im2col matrix of one group's input:
 * col[(c, ky, kx), j] = x[c, oy*sh - pt + ky*dh, ox*sw - pl + kx*dw] for output position
 * j = (oy, ox), 0 where that lands in the padding.  col rows are `count` long. */
VECTOR_CLONES
static void im2col_block(const float *x, const struct conv_geometry *g, int64_t start,
                         int64_t count, float *col)
{
    int64_t rows = g->channels * g->k_h * g->k_w;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t c = r / (g->k_h * g->k_w), ky = (r / g->k_w) % g->k_h, kx = r % g->k_w;
        const float *xc = x + (size_t)c * g->in_h * g->in_w;
        float *out = col + (size_t)r * count;
        int64_t oy = start / g->out_w, ox = start % g->out_w, x0 = kx * g->dil_w - g->pad_left;
        int64_t lo, hi; /* output columns that read inside the input row */
        inside_range(x0, g->stride_w, g->in_w, g->out_w, &lo, &hi);
        for (int64_t i = 0; i < count; ox = 0, ++oy) {
            int64_t run = g->out_w - ox < count - i ? g->out_w - ox : count - i;
            int64_t iy = oy * g->stride_h - g->pad_top + ky * g->dil_h;
            float *dst = out + i - ox; /* dst[o] is output column o of this row */
            if (iy < 0 || iy >= g->in_h) {
                memset(dst + ox, 0, sizeof(float) * (size_t)run);
            } else {
                const float *xrow = xc + (size_t)iy * g->in_w;
                int64_t end = ox + run, a = lo > ox ? lo : ox, b = hi < end ? hi : end;
                if (a > b) a = b = end;
                for (int64_t o = ox; o < a; ++o) dst[o] = 0.0f;
                if (g->stride_w == 1 && b > a)
                    memcpy(dst + a, xrow + a + x0, sizeof(float) * (size_t)(b - a));
                else if (b > a)
                    for (int64_t o = a; o < b; ++o) dst[o] = xrow[o * g->stride_w + x0];
                for (int64_t o = b; o < end; ++o) dst[o] = 0.0f;
            }
            i += run;
        }
    }
}

static void output_block(float *y, const float *bias, const float *residual, int64_t channels,
                         size_t plane, size_t start, size_t count, int act, float alpha,
                         float beta);

/* The output step of output plane p (image p / out_c, channel p % out_c), while it is in cache. */
void conv_finish_plane(const struct conv_output *o, float *y, int64_t p, int64_t out_c,
                       size_t plane)
{
    output_block(y + (size_t)p * plane, o->bias != NULL ? o->bias + p % out_c : NULL,
                 o->residual != NULL ? o->residual + (size_t)p * plane : NULL, 1, plane, 0, plane,
                 o->act, o->alpha, o->beta);
}

static int is_pointwise(const struct conv_geometry *g)
{
    return g->k_h == 1 && g->k_w == 1 && g->stride_h == 1 && g->stride_w == 1 &&
           g->pad_top == 0 && g->pad_left == 0 && g->out_h == g->in_h && g->out_w == g->in_w;
}

/* y[c, j] = act(y[c, j] + bias[c] + residual[c, j]) for channels [0, channels) and output
 * positions j in [start, start + count); y and residual have planes of `plane`. */
VECTOR_CLONES
static void output_block(float *y, const float *bias, const float *residual, int64_t channels,
                         size_t plane, size_t start, size_t count, int act, float alpha,
                         float beta)
{
    for (int64_t c = 0; c < channels; ++c) {
        float *yc = y + (size_t)c * plane + start;
        if (bias != NULL) {
            float bc = bias[c];
            for (size_t i = 0; i < count; ++i) yc[i] += bc;
        }
        if (residual != NULL) {
            const float *rc = residual + (size_t)c * plane + start;
            for (size_t i = 0; i < count; ++i) yc[i] += rc[i];
        }
        activate_inplace(yc, count, act, alpha, beta);
    }
}

/* The output step over whole images, parallel over channels. */
static void output_step(float *y, int64_t batch, int64_t channels, size_t plane,
                        const float *bias, const float *residual, int act, float alpha,
                        float beta)
{
    int64_t planes = (int64_t)batch * channels;
    #pragma omp parallel for num_threads(threads_for((size_t)planes * plane)) schedule(static)
    for (int64_t p = 0; p < planes; ++p)
        output_block(y + (size_t)p * plane, bias != NULL ? bias + p % channels : NULL,
                     residual != NULL ? residual + (size_t)p * plane : NULL, 1, plane, 0, plane,
                     act, alpha, beta);
}

enum { COL_BLOCK_FLOATS = 256 * 1024, MIN_BLOCK_COLUMNS = 64 };

/* Output positions per im2col block: the block (depth x columns) stays within a few hundred
 * KiB, so it is still in cache when the GEMM reads it. */
static int64_t block_columns(int64_t depth, size_t plane)
{
    size_t cols = COL_BLOCK_FLOATS / (size_t)depth;
    cols = cols < MIN_BLOCK_COLUMNS ? MIN_BLOCK_COLUMNS : cols / 16 * 16;
    return (int64_t)(cols < plane ? cols : plane);
}

/* General convolution: im2col a block of output positions, one single-threaded GEMM for it,
 * then its output step, each block on one OpenMP thread. */
static int conv_im2col(const float *x, const struct conv_geometry *g, int64_t batch,
                       int64_t group, const float *w, int64_t out_c, const float *bias,
                       const float *residual, float *y, int act, float alpha, float beta)
{
    int64_t out_per_group = out_c / group, depth = g->channels * g->k_h * g->k_w;
    size_t plane = (size_t)g->out_h * g->out_w, in_plane = (size_t)g->in_h * g->in_w;
    int64_t columns = block_columns(depth, plane);
    int64_t blocks = ((int64_t)plane + columns - 1) / columns;
    /* One image whose plane fits one block (a strided 1x1 convolution of resnet50) would run
     * on one thread.  Its output channels are cut into one chunk per thread instead, in whole
     * 16-row tiles of the GEMM: each chunk takes every column, so the shares are even (cutting
     * the plane into 16-column pieces gave 112 and 84 of 196 positions, or 32 and 17 of 49),
     * at the price of one more im2col of the block per chunk (depth x columns copies against
     * depth x columns x channels multiply-adds).  With fewer tiles than that, the plane is
     * cut instead. */
    int64_t units = (int64_t)batch * group * blocks, pool = kernels_get_num_threads();
    int64_t chunks = 1, per_chunk = out_per_group, tiles = (out_per_group + 15) / 16;
    if (units < pool && tiles >= pool / units) {
        chunks = pool / units;
        per_chunk = (tiles + chunks - 1) / chunks * 16;
        chunks = (out_per_group + per_chunk - 1) / per_chunk;
    } else if (units < pool) { /* too few channels: one piece of the plane per thread */
        int64_t share = ((int64_t)plane + pool - 1) / pool;
        share = (share + 15) / 16 * 16;
        if (share < columns)
            columns = share;
        blocks = ((int64_t)plane + columns - 1) / columns;
        units = (int64_t)batch * group * blocks;
    }
    int64_t tasks = units * chunks;
    size_t work = (size_t)units * columns * depth * (size_t)out_per_group / 64;
    int threads = threads_for(work);
    if (threads > tasks)
        threads = (int)tasks;
    float *cols = malloc(sizeof(float) * (size_t)depth * columns * threads);
    if (cols == NULL)
        return -1;
    #pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int64_t t = 0; t < tasks; ++t) {
        int64_t unit = t / chunks, m0 = (t % chunks) * per_chunk;
        int64_t m1 = m0 + per_chunk < out_per_group ? m0 + per_chunk : out_per_group;
        int64_t image = unit / (group * blocks), gi = (unit / blocks) % group, blk = unit % blocks;
        int64_t start = blk * columns;
        int64_t count = (int64_t)plane - start < columns ? (int64_t)plane - start : columns;
        float *col = cols + (size_t)depth * columns * omp_get_thread_num();
        const float *xg = x + ((size_t)image * group * g->channels + (size_t)gi * g->channels) * in_plane;
        size_t y_offset = ((size_t)image * out_c + (size_t)gi * out_per_group + m0) * plane;
        im2col_block(xg, g, start, count, col);
        gemm_block(0, 0, (int)(m1 - m0), (int)count, (int)depth, 1.0f,
                   w + ((size_t)gi * out_per_group + m0) * depth, (int)depth, col, (int)count,
                   0.0f, y + y_offset + start, (int)plane);
        output_block(y + y_offset, bias != NULL ? bias + gi * out_per_group + m0 : NULL,
                     residual != NULL ? residual + y_offset : NULL, m1 - m0, plane, start,
                     count, act, alpha, beta);
    }
    free(cols);
    return 0;
}

/* Stride-1 convolution as one GEMM per kernel tap, with no im2col: on a zero-padded copy of
 * the input, rows Wp = in_w + pads wide, tap (ky, kx) of every output position reads the
 * padded plane at a fixed offset, so out[oc, oy * Wp + ox] += W_tap[oc, :] . xpad[:, offset +
 * oy * Wp + ox] is a plain GEMM over a "wide" output that has Wp - out_w junk columns per row,
 * dropped in the output step.  Each tap's GEMM has depth in_c (not in_c * taps) but reads
 * nothing twice in memory. */
static int conv_shifted(const float *x, const struct conv_geometry *g, int64_t batch,
                        int64_t group, const float *w, int64_t out_c, int64_t pad_bottom,
                        int64_t pad_right, const float *bias, const float *residual, float *y,
                        int act, float alpha, float beta)
{
    int64_t cin = g->channels, out_per_group = out_c / group, taps = g->k_h * g->k_w;
    int64_t wp = g->in_w + g->pad_left + pad_right, hp = g->in_h + g->pad_top + pad_bottom;
    size_t padded_plane = (size_t)hp * wp, tail = (size_t)(g->k_w - 1) * g->dil_w;
    size_t wide_plane = (size_t)g->out_h * wp, plane = (size_t)g->out_h * g->out_w;
    float *xpad = calloc((size_t)cin * padded_plane + tail, sizeof(float));
    float *packed = malloc(sizeof(float) * (size_t)taps * out_per_group * cin);
    float *wide = malloc(sizeof(float) * (size_t)out_per_group * wide_plane);
    if (xpad == NULL || packed == NULL || wide == NULL) {
        free(xpad), free(packed), free(wide);
        return -1;
    }
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t gi = 0; gi < group; ++gi) {
            const float *xg = x + ((size_t)b * group + gi) * cin * g->in_h * g->in_w;
            const float *wg = w + (size_t)gi * out_per_group * cin * taps;
            for (int64_t c = 0; c < cin; ++c)
                for (int64_t iy = 0; iy < g->in_h; ++iy)
                    memcpy(xpad + c * padded_plane + (size_t)(iy + g->pad_top) * wp + g->pad_left,
                           xg + ((size_t)c * g->in_h + iy) * g->in_w,
                           sizeof(float) * (size_t)g->in_w);
            for (int64_t t = 0; t < taps; ++t)
                for (int64_t oc = 0; oc < out_per_group; ++oc)
                    for (int64_t c = 0; c < cin; ++c)
                        packed[((size_t)t * out_per_group + oc) * cin + c] =
                            wg[((size_t)oc * cin + c) * taps + t];
            for (int64_t t = 0; t < taps; ++t) {
                size_t offset = (size_t)(t / g->k_w) * g->dil_h * wp + (size_t)(t % g->k_w) * g->dil_w;
                gemm_parallel(0, 0, (int)out_per_group, (int)wide_plane, (int)cin, 1.0f,
                              packed + (size_t)t * out_per_group * cin, (int)cin, xpad + offset,
                              (int)padded_plane, t == 0 ? 0.0f : 1.0f, wide, (int)wide_plane);
            }
            size_t y_offset = ((size_t)b * out_c + (size_t)gi * out_per_group) * plane;
            #pragma omp parallel for num_threads(threads_for((size_t)out_per_group * plane)) schedule(static)
            for (int64_t oc = 0; oc < out_per_group; ++oc) {
                float *yc = y + y_offset + (size_t)oc * plane;
                for (int64_t oy = 0; oy < g->out_h; ++oy)
                    memcpy(yc + (size_t)oy * g->out_w, wide + (size_t)oc * wide_plane + (size_t)oy * wp,
                           sizeof(float) * (size_t)g->out_w);
                output_block(yc, bias != NULL ? bias + gi * out_per_group + oc : NULL,
                             residual != NULL ? residual + y_offset + (size_t)oc * plane : NULL,
                             1, plane, 0, plane, act, alpha, beta);
            }
        }
    }
    free(xpad), free(packed), free(wide);
    return 0;
}

int conv2d_f32(const float *x, int64_t batch, int64_t in_c, int64_t in_h, int64_t in_w,
               const float *w, int64_t out_c, int64_t k_h, int64_t k_w, int64_t group,
               int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
               int64_t dil_h, int64_t dil_w, const float *bias, const float *residual, float *y,
               int64_t out_h, int64_t out_w, int act, float act_alpha, float act_beta)
{
    struct conv_geometry g = {in_c / group, in_h, in_w, k_h, k_w, stride_h, stride_w,
                              pad_top, pad_left, dil_h, dil_w, out_h, out_w};
    int64_t out_per_group = out_c / group;
    int64_t depth = g.channels * k_h * k_w; /* GEMM k: one column of im2col */
    size_t plane = (size_t)out_h * out_w, in_plane = (size_t)in_h * in_w;
    if (plane == 0 || out_c == 0 || batch == 0)
        return 0;
    struct conv_output o = {bias, residual, act, act_alpha, act_beta};
    if (g.channels == 1 && group > 1 && k_h == 3 && k_w == 3)
        return conv_depthwise3x3(x, &g, batch, group, w, out_c, y, &o);
    if (g.channels == 1 && group > 1 && phased_fits(&g, in_plane, plane))
        return conv_depthwise_phased(x, &g, batch, group, w, out_c, y, &o);
    /* every 1x1 shape measured ran faster here than through OpenBLAS plus the output pass,
     * deep ones on 7x7 planes too since conv_pointwise_avx2 takes a 49-position plane's last
     * column as dot products (1 thread, CPU-time min under load, three runs: 2048 -> 512 at
     * 7x7 1.42-1.51 ms against OpenBLAS's 1.54-1.99, 1024 -> 352 0.46-0.62 against 0.60-0.69) */
    if (depth > 0 && conv_avx2_available() && is_pointwise(&g))
        return conv_pointwise_avx2(x, batch, in_c, group, w, out_c, plane, y, &o);
    if (depth > 0 && conv_avx2_available() && group == 1 && g.channels < 8 && stem_fits(&g))
        return conv_stem_avx2(x, &g, batch, w, out_c, y, &o);
    if (depth == 0) {
        memset(y, 0, sizeof(float) * (size_t)batch * out_c * plane);
    } else if (is_pointwise(&g)) {
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t gi = 0; gi < group; ++gi)
                gemm_parallel(0, 0, (int)out_per_group, (int)plane, (int)depth, 1.0f,
                              w + (size_t)gi * out_per_group * depth, (int)depth,
                              x + ((size_t)b * in_c + (size_t)gi * g.channels) * in_plane,
                              (int)plane, 0.0f,
                              y + ((size_t)b * out_c + (size_t)gi * out_per_group) * plane,
                              (int)plane);
    } else {
        int64_t pad_bottom = out_h + (k_h - 1) * dil_h - in_h - pad_top;
        int64_t pad_right = out_w + (k_w - 1) * dil_w - in_w - pad_left;
        /* re-laying out big weights on every call costs more than im2col saves on small planes */
        int small_weights = (size_t)out_per_group * g.channels <= 128 * 128 || plane >= 784;
        /* its GEMMs walk the padded plane: their leading dimensions must fit the BLAS's int */
        int64_t padded_plane = (in_h + pad_top + pad_bottom) * (in_w + pad_left + pad_right);
        int fits = padded_plane <= INT32_MAX && out_h * (in_w + pad_left + pad_right) <= INT32_MAX;
        if (stride_h == 1 && stride_w == 1 && pad_bottom >= 0 && pad_right >= 0 && small_weights
            && fits)
            return conv_shifted(x, &g, batch, group, w, out_c, pad_bottom, pad_right, bias,
                                residual, y, act, act_alpha, act_beta);
        return conv_im2col(x, &g, batch, group, w, out_c, bias, residual, y, act, act_alpha,
                           act_beta);
    }
    output_step(y, batch, out_c, plane, bias, residual, act, act_alpha, act_beta);
    return 0;
}
