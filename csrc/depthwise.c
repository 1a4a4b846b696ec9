#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"
#include "conv_internal.h"

/* One output row of a 3x3 depthwise tap set, stride 1 and no dilation.  restrict parameters
 * (GCC ignores restrict on block-scope pointers): otherwise it versions the loop on a
 * run-time alias check and runs the scalar copy. */
static inline void depthwise3x3_row(float *restrict y, const float *restrict r0,
                                    const float *restrict r1, const float *restrict r2,
                                    const float *restrict w, int64_t n)
{
    const float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5], w6 = w[6],
                w7 = w[7], w8 = w[8];
    for (int64_t ox = 0; ox < n; ++ox)
        y[ox] = w0 * r0[ox] + w1 * r0[ox + 1] + w2 * r0[ox + 2]
              + w3 * r1[ox] + w4 * r1[ox + 1] + w5 * r1[ox + 2]
              + w6 * r2[ox] + w7 * r2[ox + 1] + w8 * r2[ox + 2];
}

#if defined(__x86_64__)
/* The even (odd) columns of a[0..16) in order. */
AVX2 static inline __m256 even_columns8(const float *a)
{
    __m256 s = _mm256_shuffle_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(a + 8), _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

AVX2 static inline __m256 odd_columns8(const float *a)
{
    __m256 s = _mm256_shuffle_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(a + 8), _MM_SHUFFLE(3, 1, 3, 1));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* One output row of a 3x3 depthwise tap set at stride 2 along x, no dilation: the taps of 8
 * outputs are the even, odd and next even columns of each row.  Multiplies and adds in the
 * scalar loop's order, unfused (C11 builds do not contract), so both give the same bits.  The
 * rows are readable to 2 * n + 18 (the caller's slack past its padded plane). */
AVX2 static void depthwise3x3_s2_row_avx2(float *y, const float *r0, const float *r1,
                                          const float *r2, const float *w, int64_t n)
{
    __m256 wv[9];
    for (int k = 0; k < 9; ++k) wv[k] = _mm256_set1_ps(w[k]);
    const float *rows[3] = {r0, r1, r2};
    for (int64_t o = 0; o < n; o += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int r = 0; r < 3; ++r) {
            const float *a = rows[r] + 2 * o;
            __m256 t0 = _mm256_mul_ps(wv[3 * r], even_columns8(a));
            acc = r == 0 ? t0 : _mm256_add_ps(acc, t0);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(wv[3 * r + 1], odd_columns8(a)));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(wv[3 * r + 2], even_columns8(a + 2)));
        }
        if (o + 8 <= n) {
            _mm256_storeu_ps(y + o, acc);
        } else {
            float last[8];
            _mm256_storeu_ps(last, acc);
            for (int64_t k = 0; k < n - o; ++k) y[o + k] = last[k];
        }
    }
}
#endif

/* Floats readable past each padded plane: the stride-2 row reads up to 18 past its last tap. */
enum { DEPTHWISE_SLACK = 32 };

/* A 3x3 depthwise plane from a zero-padded copy of its input (rows pw wide): every output
 * takes its 9 taps in one pass, so the loop over x carries 9 multiply-adds per element.
 * s2_avx2: stride 2 along x without dilation, by depthwise3x3_s2_row_avx2. */
VECTOR_CLONES
static void depthwise3x3_plane(const float *padded, int64_t pw, const float *wc, float *yc,
                               const struct conv_geometry *g, int s2_avx2)
{
    int64_t s = g->stride_w, dx = g->dil_w, dy = g->dil_h;
    for (int64_t oy = 0; oy < g->out_h; ++oy) {
        const float *r0 = padded + (size_t)oy * g->stride_h * pw;
        const float *r1 = r0 + (size_t)dy * pw, *r2 = r1 + (size_t)dy * pw;
        float *yrow = yc + (size_t)oy * g->out_w;
        if (s == 1 && dx == 1) {
            depthwise3x3_row(yrow, r0, r1, r2, wc, g->out_w);
            continue;
        }
#if defined(__x86_64__)
        if (s2_avx2) {
            depthwise3x3_s2_row_avx2(yrow, r0, r1, r2, wc, g->out_w);
            continue;
        }
#endif
        for (int64_t ox = 0; ox < g->out_w; ++ox) {
            int64_t ix = ox * s;
            yrow[ox] = wc[0] * r0[ix] + wc[1] * r0[ix + dx] + wc[2] * r0[ix + 2 * dx]
                     + wc[3] * r1[ix] + wc[4] * r1[ix + dx] + wc[5] * r1[ix + 2 * dx]
                     + wc[6] * r2[ix] + wc[7] * r2[ix + dx] + wc[8] * r2[ix + 2 * dx];
        }
    }
}

/* 3x3 depthwise over all planes, each through a per-thread zero-padded copy of its input. */
static int depthwise3x3_padded(const float *x, const struct conv_geometry *g, int64_t batch,
                             int64_t group, const float *w, int64_t out_c, float *y,
                             const struct conv_output *o)
{
    int64_t per_channel = out_c / group;
    /* the padded plane holds every row and column a tap reads, the far pads included */
    int64_t ph = (g->out_h - 1) * g->stride_h + 2 * g->dil_h + 1;
    int64_t pw = (g->out_w - 1) * g->stride_w + 2 * g->dil_w + 1;
    if (ph < g->in_h + g->pad_top) ph = g->in_h + g->pad_top;
    if (pw < g->in_w + g->pad_left) pw = g->in_w + g->pad_left;
    size_t plane = (size_t)g->out_h * g->out_w, in_plane = (size_t)g->in_h * g->in_w;
    size_t padded_plane = (size_t)ph * pw + DEPTHWISE_SLACK;
    int64_t planes = (int64_t)batch * out_c;
    int threads = threads_for((size_t)planes * plane * 9);
#if defined(__x86_64__)
    int s2_avx2 = have_avx2() && g->stride_w == 2 && g->dil_w == 1;
#else
    int s2_avx2 = 0;
#endif
    float *scratch = calloc(padded_plane * threads, sizeof(float));
    if (scratch == NULL)
        return -1;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
        int64_t b = p / out_c, oc = p % out_c;
        const float *xc = x + ((size_t)b * group + (size_t)(oc / per_channel)) * in_plane;
        float *padded = scratch + padded_plane * omp_get_thread_num();
        /* the border stays zero from calloc: only the interior is ever written */
        for (int64_t iy = 0; iy < g->in_h; ++iy)
            memcpy(padded + (size_t)(iy + g->pad_top) * pw + g->pad_left,
                   xc + (size_t)iy * g->in_w, sizeof(float) * (size_t)g->in_w);
        depthwise3x3_plane(padded, pw, w + (size_t)oc * 9, y + (size_t)p * plane, g, s2_avx2);
        conv_finish_plane(o, y, p, out_c, plane);
    }
    free(scratch);
    return 0;
}

/* acc[i] (+)= sum of w[t] * src[t][i] over `count` taps (1, 4 or 5), i in [0, n).  restrict
 * parameters so that GCC vectorises without a run-time alias check. */
static inline void tap_group(float *restrict acc, const float *restrict s0,
                             const float *restrict s1, const float *restrict s2,
                             const float *restrict s3, const float *restrict s4, const float *w,
                             int count, int first, int64_t n)
{
    const float w0 = w[0];
    if (count == 5) {
        const float w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4];
        if (first)
            for (int64_t i = 0; i < n; ++i)
                acc[i] = w0 * s0[i] + w1 * s1[i] + w2 * s2[i] + w3 * s3[i] + w4 * s4[i];
        else
            for (int64_t i = 0; i < n; ++i)
                acc[i] += w0 * s0[i] + w1 * s1[i] + w2 * s2[i] + w3 * s3[i] + w4 * s4[i];
    } else if (count == 4) {
        const float w1 = w[1], w2 = w[2], w3 = w[3];
        if (first)
            for (int64_t i = 0; i < n; ++i) acc[i] = w0 * s0[i] + w1 * s1[i] + w2 * s2[i] + w3 * s3[i];
        else
            for (int64_t i = 0; i < n; ++i) acc[i] += w0 * s0[i] + w1 * s1[i] + w2 * s2[i] + w3 * s3[i];
    } else if (first) {
        for (int64_t i = 0; i < n; ++i) acc[i] = w0 * s0[i];
    } else {
        for (int64_t i = 0; i < n; ++i) acc[i] += w0 * s0[i];
    }
}

/* Geometry of a depthwise plane laid out by phase: the zero-padded input plane (ph x pw) split
 * into stride_h x stride_w phase planes of qh x qw, phase (py, px) holding padded[r * sh + py]
 * [c * sw + px].  Tap (ky, kx) of output (oy, ox) reads padded[oy sh + ky dh][ox sw + kx dw],
 * which is phase ((ky dh) % sh, (kx dw) % sw) at [oy + ky dh / sh][ox + kx dw / sw]: so over
 * a "wide" output of out_h rows qw long (qw - out_w junk columns per row), every tap is one
 * contiguous run of the phase plane at a fixed offset. */
struct phased {
    int64_t qh, qw, plane;
    int64_t wide; /* out_h * qw rounded up to whole vectors: no scalar tail */
    int64_t size; /* all phases plus the tail that the last junk columns read */
};

static struct phased phased_layout(const struct conv_geometry *g)
{
    int64_t ph = (g->out_h - 1) * g->stride_h + (g->k_h - 1) * g->dil_h + 1;
    int64_t pw = (g->out_w - 1) * g->stride_w + (g->k_w - 1) * g->dil_w + 1;
    if (ph < g->in_h + g->pad_top) ph = g->in_h + g->pad_top;
    if (pw < g->in_w + g->pad_left) pw = g->in_w + g->pad_left;
    struct phased p;
    p.qh = (ph + g->stride_h - 1) / g->stride_h;
    p.qw = (pw + g->stride_w - 1) / g->stride_w;
    p.plane = p.qh * p.qw;
    p.wide = (g->out_h * p.qw + 7) / 8 * 8;
    p.size = g->stride_h * g->stride_w * p.plane + ((g->k_w - 1) * g->dil_w) / g->stride_w + 1
             + (p.wide - g->out_h * p.qw);
    return p;
}

/* One depthwise output plane through the phase layout: offsets[t] is where tap t starts in
 * buf; buf (p->size floats) and wide (p->wide floats) are the calling thread's scratch. */
VECTOR_CLONES
static void depthwise_phased_plane(const float *xc, const float *wc, float *yc,
                                   const struct conv_geometry *g, const struct phased *p,
                                   const int64_t *offsets, float *buf, float *wide)
{
    int64_t sh = g->stride_h, sw = g->stride_w;
    memset(buf, 0, sizeof(float) * (size_t)p->size);
    /* padded row iy + pad_top is row r of row phase `phase`: counted, not divided, per row */
    int64_t phase = g->pad_top % sh, r = g->pad_top / sh;
    for (int64_t iy = 0; iy < g->in_h; ++iy, ++phase == sh ? (phase = 0, ++r) : 0) {
        const float *xrow = xc + (size_t)iy * g->in_w;
        float *row = buf + (phase * sw * p->qh + r) * p->qw;
        if (sw == 1) {
            for (int64_t ix = 0; ix < g->in_w; ++ix) row[g->pad_left + ix] = xrow[ix];
            continue;
        }
        /* input column ix lands in column phase px at c, ix + pad_left = c * sw + px: the
         * columns ix0, ix0 + sw, ... share a phase and fill it left to right */
        int64_t px = g->pad_left % sw, c0 = g->pad_left / sw;
        for (int64_t ix0 = 0; ix0 < sw && ix0 < g->in_w; ++ix0, ++px == sw ? (px = 0, ++c0) : 0) {
            float *dst = row + px * p->plane + c0;
            for (int64_t ix = ix0, c = 0; ix < g->in_w; ix += sw, ++c)
                dst[c] = xrow[ix];
        }
    }
    int64_t taps = g->k_h * g->k_w, n = p->wide, group = taps % 5 == 0 ? 5 : 4;
    const float *src[5];
    for (int64_t t = 0; t < taps; t += group) {
        int count = taps - t < group ? (int)(taps - t) : (int)group;
        for (int k = 0; k < count; ++k)
            src[k] = buf + offsets[t + k];
        if (count == group)
            tap_group(wide, src[0], src[1], src[2], src[3], src[count - 1], wc + t, count, t == 0, n);
        else
            for (int k = 0; k < count; ++k)
                tap_group(wide, src[k], src[k], src[k], src[k], src[k], wc + t + k, 1,
                          t == 0 && k == 0, n);
    }
    for (int64_t oy = 0; oy < g->out_h; ++oy)
        for (int64_t ox = 0; ox < g->out_w; ++ox)
            yc[oy * g->out_w + ox] = wide[oy * p->qw + ox];
}

/* Whether the phase layout of a plane stays near the size of its input and output.  Each axis
 * is rounded up to whole strides, so a stride far past the input (one output per axis) would
 * make stride x stride mostly empty phase planes, and huge pads a huge padded plane; those go
 * to im2col.  In double: the products may not fit int64. */
static int phased_layout_fits(const struct conv_geometry *g, size_t in_plane, size_t plane)
{
    double ph = (double)(g->out_h - 1) * g->stride_h + (double)(g->k_h - 1) * g->dil_h + 1.0;
    double pw = (double)(g->out_w - 1) * g->stride_w + (double)(g->k_w - 1) * g->dil_w + 1.0;
    if (ph < (double)g->in_h + g->pad_top) ph = (double)g->in_h + g->pad_top;
    if (pw < (double)g->in_w + g->pad_left) pw = (double)g->in_w + g->pad_left;
    double size = (ph + g->stride_h) * (pw + g->stride_w);
    return size <= 4.0 * ((double)in_plane + (double)plane * g->k_h * g->k_w) + 65536.0;
}

/* Depthwise convolution of any kernel size, stride and dilation through the phase layout,
 * parallel over planes. */
static int depthwise_phased(const float *x, const struct conv_geometry *g, int64_t batch,
                                 int64_t group, const float *w, int64_t out_c, float *y,
                                 const struct conv_output *o)
{
    int64_t per_channel = out_c / group, taps = g->k_h * g->k_w;
    struct phased p = phased_layout(g);
    size_t plane = (size_t)g->out_h * g->out_w, in_plane = (size_t)g->in_h * g->in_w;
    size_t scratch_floats = (size_t)p.size + (size_t)p.wide;
    int64_t planes = (int64_t)batch * out_c;
    int threads = threads_for((size_t)planes * plane * taps);
    float *scratch = malloc(sizeof(float) * scratch_floats * threads);
    int64_t *offsets = malloc(sizeof(int64_t) * (size_t)taps);
    if (scratch == NULL || offsets == NULL) {
        free(scratch), free(offsets);
        return -1;
    }
    for (int64_t t = 0; t < taps; ++t) {
        int64_t dy = (t / g->k_w) * g->dil_h, dx = (t % g->k_w) * g->dil_w;
        offsets[t] = ((dy % g->stride_h) * g->stride_w + dx % g->stride_w) * p.plane
                     + (dy / g->stride_h) * p.qw + dx / g->stride_w;
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t q = 0; q < planes; ++q) {
        int64_t b = q / out_c, oc = q % out_c;
        float *buf = scratch + scratch_floats * omp_get_thread_num();
        depthwise_phased_plane(x + ((size_t)b * group + (size_t)(oc / per_channel)) * in_plane,
                               w + (size_t)oc * taps, y + (size_t)q * plane, g, &p, offsets,
                               buf, buf + p.size);
        conv_finish_plane(o, y, q, out_c, plane);
    }
    free(scratch), free(offsets);
    return 0;
}

#if defined(__x86_64__)
/* Depthwise convolution with AVX2, straight from the input planes: no padded copy, no scratch.
 * Eight adjacent outputs of one row form a vector; each tap loads the input columns it reads
 * (stride 2: sixteen columns, then their even lanes) with the columns outside the row masked
 * to zero, and a row of taps in the padding reads a row of zeros, so the padding costs no copy
 * and the border no scalar code.  Zeros are multiplied as the reference's padded input is
 * (inf * 0 gives NaN there too). */
enum {
    DW_MAX_K = 8,       /* kernel rows and columns */
    DW_MAX_ROWS = 7,    /* output rows computed together: independent sums hide the latency of
                         * the multiply-adds, and they share the loads of input rows */
    DW_ZERO_ROW = 256,  /* the row of zeros: a block's taps span (k_w - 1) * dil_w + 16 columns */
    DW_MAX_DIM = 1 << 24,
};

static const float dw_zeros[DW_ZERO_ROW] __attribute__((aligned(32)));

/* Lanes i of 8 with 0 <= c0 + i < in_w, all ones; the rest zero. */
AVX2 static inline __m256i columns_inside(int64_t c0, int64_t in_w)
{
    int64_t lo = -c0, hi = in_w - c0;
    lo = lo < 0 ? 0 : lo > 8 ? 8 : lo;
    hi = hi < 0 ? 0 : hi > 8 ? 8 : hi;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i from_lo = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32((int)lo - 1));
    __m256i below_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)hi), lane);
    return _mm256_and_si256(from_lo, below_hi);
}

/* The first n (1..7) lanes of v to y. */
AVX2 static inline void store_first(float *y, __m256 v, int64_t n)
{
    __m128 lo = _mm256_castps256_ps128(v);
    if (n >= 4) {
        _mm_storeu_ps(y, lo);
        y += 4, n -= 4;
        lo = _mm256_extractf128_ps(v, 1);
    }
    if (n >= 2) {
        _mm_storel_pi((__m64 *)y, lo);
        y += 2, n -= 2;
        lo = _mm_movehl_ps(lo, lo);
    }
    if (n == 1)
        _mm_store_ss(y, lo);
}

/* Eight floats from row + c, the lanes outside the row zero unless full. */
AVX2 static inline __m256 load_columns(const float *row, int64_t c, __m256i mask, int full)
{
    return full ? _mm256_loadu_ps(row + c) : _mm256_maskload_ps(row + c, mask);
}

/* The columns that each of the kw taps of one kernel row reads for 8 adjacent outputs: at
 * stride 1 columns c0[kx] .. c0[kx] + 7 of row; at stride 2 columns c0[kx] + 2i, in the lane
 * order of one in-lane shuffle (outputs 0 1 4 5 2 3 6 7: the sums are put in order once, at
 * the end), with the odd columns of a pair of loads serving the next tap where dw is 1.
 * mask[sw * kx + h]: the columns inside the row of the h-th 8 from c0[kx]. */
AVX2 static inline __attribute__((always_inline)) void row_taps(
    __m256 *t, const float *row, const int64_t *c0, const __m256i *mask, int full, int kw,
    int sw, int64_t dw)
{
    if (sw == 1) {
        for (int kx = 0; kx < kw; ++kx)
            t[kx] = load_columns(row, c0[kx], mask[kx], full);
        return;
    }
    for (int kx = 0; kx < kw; ++kx) {
        __m256 a = load_columns(row, c0[kx], mask[2 * kx], full);
        __m256 b = load_columns(row, c0[kx] + 8, mask[2 * kx + 1], full);
        t[kx] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        if (dw == 1 && kx + 1 < kw) {
            ++kx;
            t[kx] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        }
    }
}

/* Strides and dilations: constants where a specialised plane function inlines them. */
struct dw_steps {
    int64_t sh, sw, dh, dw;
};

/* Output columns [ox0, ox0 + 8) of every row of one plane (those past out_w are computed
 * and dropped), `rows` rows at a time (those past out_h too).  full: every tap of the block
 * reads inside the input row.  by_input_row (where the steps are constants): the taps of each
 * input row the group reads are loaded once and serve every output row that reads them. */
AVX2 static inline __attribute__((always_inline)) void depthwise_columns(
    const struct conv_geometry *g, const float *xc, const __m256 *wv, __m256 bias,
    const float *res, float *yc, int64_t ox0, int kh, int kw, struct dw_steps st, int full,
    int rows, int by_input_row)
{
    const int64_t in_h = g->in_h, in_w = g->in_w, pad_top = g->pad_top, out_h = g->out_h;
    const int64_t out_w = g->out_w;
    __m256i mask[2 * DW_MAX_K];
    int64_t c0[DW_MAX_K];
    for (int kx = 0; kx < kw; ++kx) {
        c0[kx] = ox0 * st.sw + kx * st.dw - g->pad_left;
        for (int h = 0; h < st.sw; ++h)
            mask[st.sw * kx + h] = full ? _mm256_setzero_si256()
                                        : columns_inside(c0[kx] + 8 * h, in_w);
    }
    /* zero_row + c0[kx] + lane stays inside dw_zeros */
    const float *zero_row = dw_zeros - c0[0];
    int64_t plane = out_h * out_w, n = out_w - ox0 < 8 ? out_w - ox0 : 8;
    __m256i first_n = columns_inside(0, n);
    for (int64_t oy = 0; oy < out_h; oy += rows) {
        __m256 acc[DW_MAX_ROWS];
        for (int r = 0; r < rows; ++r)
            acc[r] = bias;
        int64_t iy0 = oy * st.sh - pad_top;
        if (by_input_row) {
            int64_t span = (rows - 1) * st.sh + (kh - 1) * st.dh + 1;
#pragma GCC unroll 32
            for (int64_t j = 0; j < span; ++j) {
                int64_t iy = iy0 + j;
                const float *row = (uint64_t)iy < (uint64_t)in_h ? xc + iy * in_w : zero_row;
                __m256 t[DW_MAX_K];
                row_taps(t, row, c0, mask, full, kw, (int)st.sw, st.dw);
#pragma GCC unroll 8
                for (int r = 0; r < rows; ++r) {
                    int64_t d = j - r * st.sh; /* ky * dh */
                    if (d < 0 || d % st.dh != 0 || d / st.dh >= kh)
                        continue;
                    int64_t ky = d / st.dh;
#pragma GCC unroll 8
                    for (int kx = 0; kx < kw; ++kx)
                        acc[r] = _mm256_fmadd_ps(wv[ky * kw + kx], t[kx], acc[r]);
                }
            }
        } else {
            for (int ky = 0; ky < kh; ++ky)
                for (int r = 0; r < rows; ++r) {
                    int64_t iy = iy0 + r * st.sh + ky * st.dh;
                    const float *row = (uint64_t)iy < (uint64_t)in_h ? xc + iy * in_w : zero_row;
                    __m256 t[DW_MAX_K];
                    row_taps(t, row, c0, mask, full, kw, (int)st.sw, st.dw);
                    for (int kx = 0; kx < kw; ++kx)
                        acc[r] = _mm256_fmadd_ps(wv[ky * kw + kx], t[kx], acc[r]);
                }
        }
        for (int r = 0; r < rows && oy + r < out_h; ++r) {
            int64_t at = (oy + r) * out_w + ox0;
            if (st.sw == 2)
                acc[r] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(acc[r]),
                                                                _MM_SHUFFLE(3, 1, 2, 0)));
            /* a whole vector where it stays inside the plane: the lanes past this row land on
             * outputs written later (rows go down, and the last column block goes first) */
            if (at + 8 <= plane) {
                if (res != NULL)
                    acc[r] = _mm256_add_ps(acc[r], _mm256_loadu_ps(res + at));
                _mm256_storeu_ps(yc + at, acc[r]);
            } else {
                if (res != NULL)
                    acc[r] = _mm256_add_ps(acc[r], _mm256_maskload_ps(res + at, first_n));
                store_first(yc + at, acc[r], n);
            }
        }
    }
}

/* One output plane: column blocks from the last to the first (see depthwise_columns). */
AVX2 static inline __attribute__((always_inline)) void depthwise_plane_avx2(
    const struct conv_geometry *g, const float *xc, const float *wc, float bias,
    const float *res, float *yc, int kh, int kw, struct dw_steps st, int by_input_row,
    int sevens)
{
    __m256 wv[DW_MAX_K * DW_MAX_K];
    for (int t = 0; t < kh * kw; ++t)
        wv[t] = _mm256_set1_ps(wc[t]);
    __m256 b = _mm256_set1_ps(bias);
    int64_t span = (kw - 1) * st.dw + 8 * st.sw; /* columns a block's taps read */
    for (int64_t ox0 = (g->out_w - 1) / 8 * 8; ox0 >= 0; ox0 -= 8) {
        int64_t c = ox0 * st.sw - g->pad_left;
        int full = c >= 0 && c + span <= g->in_w;
        if (sevens)
            full ? depthwise_columns(g, xc, wv, b, res, yc, ox0, kh, kw, st, 1, 7, by_input_row)
                 : depthwise_columns(g, xc, wv, b, res, yc, ox0, kh, kw, st, 0, 7, by_input_row);
        else
            full ? depthwise_columns(g, xc, wv, b, res, yc, ox0, kh, kw, st, 1, 4, by_input_row)
                 : depthwise_columns(g, xc, wv, b, res, yc, ox0, kh, kw, st, 0, 4, by_input_row);
    }
}

/* sevens: 7 output rows at once, else 4 (see conv_depthwise_avx2) */
typedef void (*depthwise_plane_fn)(const struct conv_geometry *, const float *, const float *,
                                   float, const float *, float *, int sevens);

#define DW_PLANE(name, kh, kw, sh, sw, dh, dw, by_input_row)                                   \
    AVX2 static void name(const struct conv_geometry *g, const float *xc, const float *wc,     \
                          float bias, const float *res, float *yc, int sevens)                 \
    {                                                                                          \
        depthwise_plane_avx2(g, xc, wc, bias, res, yc, kh, kw, (struct dw_steps){sh, sw, dh, dw}, \
                             by_input_row, sevens);                                            \
    }

/* the models' kernels, then any size, stride and dilation with stride 1 or 2 along x */
DW_PLANE(plane_k3_s1, 3, 3, 1, 1, 1, 1, 1)
DW_PLANE(plane_k3_s2, 3, 3, 2, 2, 1, 1, 1)
DW_PLANE(plane_k5_s1, 5, 5, 1, 1, 1, 1, 1)
DW_PLANE(plane_k5_s2, 5, 5, 2, 2, 1, 1, 1)
DW_PLANE(plane_any_s1, (int)g->k_h, (int)g->k_w, g->stride_h, 1, g->dil_h, g->dil_w, 0)
DW_PLANE(plane_any_s2, (int)g->k_h, (int)g->k_w, g->stride_h, 2, g->dil_h, g->dil_w, 0)

/* The AVX2 plane function for this geometry, or NULL where it does not apply: no AVX2, a
 * stride along x other than 1 or 2, a kernel larger than DW_MAX_K, a block's taps wider than
 * the row of zeros, or sizes whose column arithmetic would leave 32 bits. */
static depthwise_plane_fn depthwise_avx2_for(const struct conv_geometry *g)
{
    if (!have_avx2() || g->k_w > DW_MAX_K || g->k_h > DW_MAX_K || g->k_w < 1 || g->k_h < 1
        || (g->stride_w != 1 && g->stride_w != 2) || g->in_w > DW_MAX_DIM
        || g->out_w > DW_MAX_DIM || g->pad_left > DW_MAX_DIM
        || (g->k_w - 1) * g->dil_w + 8 * g->stride_w > DW_ZERO_ROW)
        return NULL;
    int unit = g->stride_h == g->stride_w && g->dil_h == 1 && g->dil_w == 1;
    if (unit && g->k_h == 3 && g->k_w == 3)
        return g->stride_w == 1 ? plane_k3_s1 : plane_k3_s2;
    if (unit && g->k_h == 5 && g->k_w == 5)
        return g->stride_w == 1 ? plane_k5_s1 : plane_k5_s2;
    return g->stride_w == 1 ? plane_any_s1 : plane_any_s2;
}

static int conv_depthwise_avx2(depthwise_plane_fn fn, const float *x,
                               const struct conv_geometry *g, int64_t batch, int64_t group,
                               const float *w, int64_t out_c, float *y,
                               const struct conv_output *o)
{
    int64_t per_channel = out_c / group, taps = g->k_h * g->k_w;
    size_t plane = (size_t)g->out_h * g->out_w, in_plane = (size_t)g->in_h * g->in_w;
    int64_t planes = batch * out_c;
    /* 7 independent sums where the rows come in sevens (those of a 224 x 224 model) and span
     * at most 28 input rows; on larger planes 4 measure faster */
    int sevens = g->out_h % 7 == 0 && g->out_h * g->stride_h <= 28;
    PARALLEL_FOR(threads_for((size_t)planes * plane * (size_t)taps),
        for (int64_t p = 0; p < planes; ++p) {
            int64_t b = p / out_c, oc = p % out_c;
            float *yc = y + (size_t)p * plane;
            fn(g, x + ((size_t)b * group + (size_t)(oc / per_channel)) * in_plane,
               w + (size_t)oc * taps, o->bias != NULL ? o->bias[oc] : 0.0f,
               o->residual != NULL ? o->residual + (size_t)p * plane : NULL, yc, sevens);
            activate_inplace(yc, plane, o->act, o->alpha, o->beta);
        });
    return 0;
}
#endif

/* The entry points conv2d_f32 calls (conv_internal.h): where the AVX2 kernel applies it runs
 * every depthwise convolution; elsewhere 3x3 ones go through a padded copy of each plane and
 * the others through the phase layout where that stays small (else conv.c's im2col). */
int conv_depthwise3x3(const float *x, const struct conv_geometry *g, int64_t batch,
                      int64_t group, const float *w, int64_t out_c, float *y,
                      const struct conv_output *o)
{
#if defined(__x86_64__)
    depthwise_plane_fn fn = depthwise_avx2_for(g);
    if (fn != NULL)
        return conv_depthwise_avx2(fn, x, g, batch, group, w, out_c, y, o);
#endif
    return depthwise3x3_padded(x, g, batch, group, w, out_c, y, o);
}

int phased_fits(const struct conv_geometry *g, size_t in_plane, size_t plane)
{
#if defined(__x86_64__)
    if (depthwise_avx2_for(g) != NULL)
        return 1;
#endif
    return phased_layout_fits(g, in_plane, plane);
}

int conv_depthwise_phased(const float *x, const struct conv_geometry *g, int64_t batch,
                          int64_t group, const float *w, int64_t out_c, float *y,
                          const struct conv_output *o)
{
#if defined(__x86_64__)
    depthwise_plane_fn fn = depthwise_avx2_for(g);
    if (fn != NULL)
        return conv_depthwise_avx2(fn, x, g, batch, group, w, out_c, y, o);
#endif
    return depthwise_phased(x, g, batch, group, w, out_c, y, o);
}
