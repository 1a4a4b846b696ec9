/* 2-D pooling, separably: per output row, the window's input rows are first reduced into one
 * padded row (contiguous, so it vectorises), then that row's columns are reduced along x.  Max
 * and sum both split this way (the average divides by the taps counted per row times those per
 * column).  A padded row longer than PADDED_ROW_LIMIT falls back to reducing tap by tap over
 * whole output rows (huge pads).  The vector paths (AVX2, AVX-512, chosen at run time by
 * have_avx2 / have_avx512) keep that order of operations (tests hold the stride-2 paths of every
 * level to the same bits). */
#include <math.h>
#include <omp.h>
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

static int maxpool_by_taps(const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
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

/* Taps of output column ox's window that count for an average (or are inside, for a max):
 * within the padded row when padding counts, else within the input row. */
static int64_t column_taps(int64_t ox, int64_t k_w, int64_t stride_w, int64_t pad_left,
                           int64_t pad_right, int64_t dil_w, int64_t in_w, int count_include_pad)
{
    int64_t x0 = ox * stride_w - pad_left, f, l;
    if (count_include_pad)
        taps_inside(x0, k_w, dil_w, -pad_left, in_w + pad_right, &f, &l);
    else
        taps_inside(x0, k_w, dil_w, 0, in_w, &f, &l);
    return l - f;
}

static int avgpool_by_taps(const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
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
    for (int64_t ox = 0; ox < out_w; ++ox)
        cols[ox] = column_taps(ox, k_w, stride_w, pad_left, pad_right, dil_w, in_w,
                                 count_include_pad);
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

enum { PADDED_ROW_LIMIT = 1 << 22 };

#define INLINE static inline __attribute__((always_inline))

INLINE float max_nan(float m, float v)
{
    return (v > m || v != v) ? v : m; /* NaN propagates either side */
}

/* The window geometry of one pool2d_f32 call. */
typedef struct {
    int64_t in_h, in_w, out_h, out_w, k_h, k_w, stride_h, stride_w, pad_top, pad_left,
        pad_bottom, dil_h, dil_w, width;
    int is_max, count_include_pad;
} pool_geometry;

#if defined(__x86_64__)
/* max_nan on 8 lanes: _mm256_max_ps gives its second operand when either is NaN. */
AVX2 static inline __m256 max_nan8(__m256 m, __m256 v)
{
    __m256 r = _mm256_max_ps(v, m);
    return _mm256_blendv_ps(r, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

/* The even (odd) columns of a[0..16) in order. */
/* The first min(n, 8) lanes of v into y (y may end before 8 floats). */
AVX2 static inline void store_up_to8(float *y, __m256 v, int64_t n)
{
    if (n >= 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    float last[8];
    _mm256_storeu_ps(last, v);
    for (int64_t k = 0; k < n; ++k) y[k] = last[k];
}

AVX2 static inline __m256 even8(const float *a)
{
    __m256 s = _mm256_shuffle_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(a + 8), _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

AVX2 static inline __m256 odd8(const float *a)
{
    __m256 s = _mm256_shuffle_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(a + 8), _MM_SHUFFLE(3, 1, 3, 1));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* t[0..n) = the max (sum) of rows[0..count)[0..n), in row order, as pool_plane's loops.  With
 * padded, t's 8 floats after n may be written and are `fill` again on return: the last columns
 * are stored whole and then refilled (a masked store is slow on AMD: with this, 272 planes of
 * 14x14 at stride 2 took 44 us, 53 before, with the whole-vector stores of stride2_taps_avx2). */
AVX2 static void reduce_rows_avx2(int is_max, float *t, const float *const *rows, int64_t count,
                                  int64_t n, int padded, float fill)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 m = _mm256_loadu_ps(rows[0] + i);
        for (int64_t r = 1; r < count; ++r)
            m = is_max ? max_nan8(m, _mm256_loadu_ps(rows[r] + i))
                       : _mm256_add_ps(m, _mm256_loadu_ps(rows[r] + i));
        _mm256_storeu_ps(t + i, m);
    }
    if (i < n) { /* the last 1..7 columns through a lane mask (a scalar max mispredicts) */
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane);
        __m256 m = _mm256_maskload_ps(rows[0] + i, mask);
        for (int64_t r = 1; r < count; ++r) {
            __m256 v = _mm256_maskload_ps(rows[r] + i, mask);
            m = is_max ? max_nan8(m, v) : _mm256_add_ps(m, v);
        }
        if (padded) {
            _mm256_storeu_ps(t + i, m);
            _mm256_storeu_ps(t + n, _mm256_set1_ps(fill));
        } else {
            _mm256_maskstore_ps(t + i, mask, m);
        }
    }
}

/* yrow[o] = the max of t[2o], t[2o+1] and, with 3 taps, t[2o+2], or their sum over rows *
 * col_count[o] (the product exact in float: at most 64 * 3); t is readable to 2 * out_w + 18,
 * col_count to out_w + 8.  Vectors starting at o <= room are stored whole (room: how far the
 * row may spill into the plane's later rows, which are written after it). */
AVX2 static void stride2_taps_avx2(int is_max, int taps, float *yrow, const float *t,
                                   int64_t out_w, float rows, const float *col_count,
                                   int64_t room)
{
    __m256 row_count = _mm256_set1_ps(rows);
    for (int64_t o = 0; o < out_w; o += 8) {
        const float *a = t + 2 * o;
        __m256 r = is_max ? max_nan8(even8(a), odd8(a)) : _mm256_add_ps(even8(a), odd8(a));
        if (taps == 3)
            r = is_max ? max_nan8(r, even8(a + 2)) : _mm256_add_ps(r, even8(a + 2));
        if (!is_max)
            r = _mm256_div_ps(r, _mm256_mul_ps(row_count, _mm256_loadu_ps(col_count + o)));
        if (o <= room)
            _mm256_storeu_ps(yrow + o, r);
        else
            store_up_to8(yrow + o, r, out_w - o);
    }
}

/* taps_inside without its divisions when the taps are adjacent (two 64-bit divisions per output
 * row were a fifth of a 14x14 plane's time at stride 2). */
static inline void window_taps_inside(int64_t start, int64_t kernel, int64_t dil, int64_t lo,
                                      int64_t hi, int64_t *first, int64_t *last)
{
    if (dil != 1) {
        taps_inside(start, kernel, dil, lo, hi, first, last);
        return;
    }
    int64_t f = start >= lo ? 0 : lo - start, l = start >= hi ? 0 : hi - start;
    if (f > kernel) f = kernel;
    if (l > kernel) l = kernel;
    *first = f;
    *last = l > f ? l : f;
}

/* Output row oy's window rows reduced into t + pad_left (the fill where none is inside), t's
 * padding columns left at the fill; the rows it counts for an average. */
AVX2 static float reduce_window_rows_avx2(const pool_geometry *gm, const float *xp, int64_t oy,
                                          float *t, float fill)
{
    const float *rows[64];
    int64_t y0 = oy * gm->stride_h - gm->pad_top, fy, ly, py0, py1;
    window_taps_inside(y0, gm->k_h, gm->dil_h, 0, gm->in_h, &fy, &ly);
    for (int64_t ky = fy; ky < ly; ++ky) rows[ky - fy] = xp + (y0 + ky * gm->dil_h) * gm->in_w;
    if (fy < ly)
        reduce_rows_avx2(gm->is_max, t + gm->pad_left, rows, ly - fy, gm->in_w, 1, fill);
    else
        for (int64_t i = 0; i < gm->in_w; ++i) t[gm->pad_left + i] = fill;
    if (!gm->count_include_pad)
        return (float)(ly - fy);
    window_taps_inside(y0, gm->k_h, gm->dil_h, -gm->pad_top, gm->in_h + gm->pad_bottom, &py0,
                       &py1);
    return (float)(py1 - py0);
}

/* pool_plane for stride 2, 2 or 3 taps along x (no dilation), with AVX2. */
AVX2 static void pool_plane_s2k3_avx2(const pool_geometry *gm, const float *xp, float *yp,
                                      float *t, const float *col_count)
{
    const int64_t out_w = gm->out_w;
    const float fill = gm->is_max ? -INFINITY : 0.0f;
    for (int64_t i = 0; i < gm->width + 32; ++i) t[i] = fill;
    for (int64_t oy = 0; oy < gm->out_h; ++oy) {
        float rows_counted = reduce_window_rows_avx2(gm, xp, oy, t, fill);
        stride2_taps_avx2(gm->is_max, (int)gm->k_w, yp + oy * out_w, t, out_w, rows_counted,
                          col_count, (gm->out_h - oy) * out_w - 8);
    }
}

/* pool_plane for planes at most 64 wide, stride 2 with 2 or 3 taps along x, no left padding:
 * each output row's window rows are reduced in up to eight registers (lanes past the row at
 * the fill), then their columns, in pool_plane's order, with no padded row in memory (its
 * stores and reloads cost a stall per row: 512 planes of 14x14 at 2x2 stride 2 took 80 us, 35
 * so; 128 of 55x55 at 3x3 stride 2, squeezenet's, 105 us, 89 so).  Only the vector holding
 * the row's end is loaded through a mask. */
AVX2 static inline __attribute__((always_inline)) void
s2_narrow_plane(const pool_geometry *gm, const float *xp, float *yp, const float *col_count,
                const int vectors)
{
    /* vectors (2, 4 or 8, a constant where inlined) keeps v in registers: indexed by a variable,
     * v went through memory and the path lost half its gain */
    const int64_t in_w = gm->in_w, out_w = gm->out_w;
    const int is_max = gm->is_max;
    const __m256 fill8 = _mm256_set1_ps(is_max ? -INFINITY : 0.0f);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i next_pair = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 7);
    /* the vector holding the row's end, when short: its lanes inside the row */
    const int64_t whole = in_w / 8;
    const __m256i last = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(in_w - 8 * whole)), lane);
    for (int64_t oy = 0; oy < gm->out_h; ++oy) {
        int64_t y0 = oy * gm->stride_h - gm->pad_top, fy, ly, py0, py1;
        window_taps_inside(y0, gm->k_h, gm->dil_h, 0, gm->in_h, &fy, &ly);
        __m256 v[9] = {fill8, fill8, fill8, fill8, fill8, fill8, fill8, fill8, fill8};
        for (int64_t ky = fy; ky < ly; ++ky) {
            const float *row = xp + (y0 + ky * gm->dil_h) * in_w;
            for (int j = 0; j < vectors; ++j) {
                __m256 a = fill8; /* past the row */
                if (j < whole)
                    a = _mm256_loadu_ps(row + 8 * j);
                else if (j == whole)
                    a = _mm256_blendv_ps(fill8, _mm256_maskload_ps(row + 8 * j, last),
                                         _mm256_castsi256_ps(last));
                if (ky == fy)
                    v[j] = a;
                else
                    v[j] = is_max ? max_nan8(v[j], a) : _mm256_add_ps(v[j], a);
            }
        }
        float rows = (float)(ly - fy);
        if (!is_max && gm->count_include_pad) {
            window_taps_inside(y0, gm->k_h, gm->dil_h, -gm->pad_top, gm->in_h + gm->pad_bottom,
                               &py0, &py1);
            rows = (float)(py1 - py0);
        }
        for (int half = 0; half < vectors / 2; ++half) {
            const int64_t o = 8 * half;
            if (o >= out_w)
                break;
            __m256 lo = v[2 * half], hi = v[2 * half + 1], next = v[2 * half + 2];
            __m256 e = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))),
                _MM_SHUFFLE(3, 1, 2, 0)));
            __m256 d = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))),
                _MM_SHUFFLE(3, 1, 2, 0)));
            __m256 r = is_max ? max_nan8(e, d) : _mm256_add_ps(e, d);
            if (gm->k_w == 3) { /* column 2o + 2: e moved down a lane, then next's first */
                __m256 e1 = _mm256_blend_ps(_mm256_permutevar8x32_ps(e, next_pair),
                                            _mm256_broadcastss_ps(_mm256_castps256_ps128(next)),
                                            0x80);
                r = is_max ? max_nan8(r, e1) : _mm256_add_ps(r, e1);
            }
            if (!is_max)
                r = _mm256_div_ps(r, _mm256_mul_ps(_mm256_set1_ps(rows),
                                                   _mm256_loadu_ps(col_count + o)));
            if (oy * out_w + o + 8 <= gm->out_h * out_w)
                _mm256_storeu_ps(yp + oy * out_w + o, r);
            else
                store_up_to8(yp + oy * out_w + o, r, out_w - o);
        }
    }
}

AVX2 static void pool_plane_s2_narrow_avx2(const pool_geometry *gm, const float *xp, float *yp,
                                           const float *col_count)
{
    if (gm->in_w <= 16)
        s2_narrow_plane(gm, xp, yp, col_count, 2);
    else if (gm->in_w <= 32)
        s2_narrow_plane(gm, xp, yp, col_count, 4);
    else
        s2_narrow_plane(gm, xp, yp, col_count, 8);
}

/* yrow[o] = the max (sum) of t[o + kx * dil_w] over kx, the sum divided by rows * col_count[o]
 * (correctly rounded as pool_plane's double product); t readable to out_w + 8 + (k_w - 1) *
 * dil_w, col_count to out_w + 8; room as stride2_taps_avx2's. */
AVX2 static void stride1_taps_avx2(int is_max, float *yrow, const float *t, int64_t out_w,
                                   int64_t k_w, int64_t dil_w, float rows, const float *col_count,
                                   int64_t room)
{
    __m256 row_count = _mm256_set1_ps(rows);
    for (int64_t o = 0; o < out_w; o += 8) {
        __m256 r = _mm256_loadu_ps(t + o);
        for (int64_t kx = 1; kx < k_w; ++kx) {
            __m256 v = _mm256_loadu_ps(t + o + kx * dil_w);
            r = is_max ? max_nan8(r, v) : _mm256_add_ps(r, v);
        }
        if (!is_max)
            r = _mm256_div_ps(r, _mm256_mul_ps(row_count, _mm256_loadu_ps(col_count + o)));
        if (o <= room)
            _mm256_storeu_ps(yrow + o, r);
        else
            store_up_to8(yrow + o, r, out_w - o);
    }
}

/* pool_plane for stride 1 along x (any taps and dilation), with AVX2. */
AVX2 static void pool_plane_s1_avx2(const pool_geometry *gm, const float *xp, float *yp,
                                    float *t, const float *col_count)
{
    const int64_t out_w = gm->out_w;
    const float fill = gm->is_max ? -INFINITY : 0.0f;
    for (int64_t i = 0; i < gm->width + 32; ++i) t[i] = fill;
    for (int64_t oy = 0; oy < gm->out_h; ++oy) {
        float rows_counted = reduce_window_rows_avx2(gm, xp, oy, t, fill);
        stride1_taps_avx2(gm->is_max, yp + oy * out_w, t, out_w, gm->k_w, gm->dil_w,
                          rows_counted, col_count, (gm->out_h - oy) * out_w - 8);
    }
}

/* Stride 1 on both axes with out_w == in_w (the "same" pools of inception): the plane is
 * reduced flat, so short rows still fill whole vectors.  First each band of output rows with
 * the same inside rows gets its window rows reduced into v (as pool_plane's rows, in order),
 * then v's taps along x, each through a per-position mask that gives the identity where the tap
 * falls in the padding (the padded row's fill there), in pool_plane's order. */
enum { FLAT_MASK_ROOM = 16 };

typedef struct {
    int64_t plane, k_w, pad_left;
    const int32_t *mask;  /* k_w masks of FLAT_MASK_ROOM + plane positions, -1 where the tap is
                           * inside: 16-lane reads from any position of the plane stay inside */
    const float *divisor; /* plane + 8: rows times columns counted (average) */
    const int64_t *bands; /* 4 per band: its output rows [start, end) and inside taps [fy, ly) */
    int64_t band_count;
} flat_geometry;

AVX2 static void pool_plane_flat_avx2(const pool_geometry *gm, const flat_geometry *fg,
                                      const float *xp, float *yp, float *v)
{
    const int64_t w = gm->in_w, plane = fg->plane;
    const float fill = gm->is_max ? -INFINITY : 0.0f;
    const float *rows[64];
    for (int64_t b = 0; b < fg->band_count; ++b) {
        const int64_t *band = fg->bands + 4 * b;
        int64_t oy = band[0], end = band[1], fy = band[2], ly = band[3], y0 = oy - gm->pad_top;
        for (int64_t ky = fy; ky < ly; ++ky)
            rows[ky - fy] = xp + (y0 + ky * gm->dil_h) * w;
        /* whole stores past the band: the next band overwrites them, and v has room after
         * the plane (a masked store is slow on AMD) */
        if (fy < ly)
            reduce_rows_avx2(gm->is_max, v + oy * w, rows, ly - fy, (end - oy) * w, 1, fill);
        else
            for (int64_t i = oy * w; i < end * w; ++i) v[i] = fill;
    }
    __m256 fill8 = _mm256_set1_ps(fill);
    for (int64_t next = 0; next < plane; next += 8) {
        /* a short last vector moves back to end with the plane, its first outputs computed
         * again, so every store is whole and inside the plane */
        int64_t i = next + 8 <= plane || plane < 8 ? next : plane - 8;
        __m256 r = fill8;
        for (int64_t kx = 0; kx < fg->k_w; ++kx) {
            __m256 inside = _mm256_castsi256_ps(
                _mm256_loadu_si256((const __m256i *)(fg->mask + kx * (plane + FLAT_MASK_ROOM) + i)));
            __m256 tap = _mm256_blendv_ps(fill8, _mm256_loadu_ps(v + i + kx - fg->pad_left), inside);
            if (kx == 0)
                r = tap;
            else
                r = gm->is_max ? max_nan8(r, tap) : _mm256_add_ps(r, tap);
        }
        if (!gm->is_max)
            r = _mm256_div_ps(r, _mm256_loadu_ps(fg->divisor + i));
        if (plane < 8)
            store_up_to8(yp + i, r, plane - i);
        else
            _mm256_storeu_ps(yp + i, r);
    }
}

/* pool_plane_flat_avx2 for 3 taps along x with one padding column, rows of 8 or more: each
 * vector of a band reduces its window rows at the three tap offsets straight from x, the
 * outer taps through masked loads (no lane past the row is read), so nothing goes through v
 * (its stores and unaligned reloads stalled: 192 planes of 28x28 took 158 us, 128 so; plain
 * loads of the outer taps where inside x, then blends, took 160).  A short
 * last vector of a band moves back to end with it, its first outputs computed again. */
AVX2 static void pool_plane_flat3_avx2(const pool_geometry *gm, const flat_geometry *fg,
                                       const float *xp, float *yp)
{
    const int64_t w = gm->in_w, plane = fg->plane;
    const int is_max = gm->is_max;
    const __m256 fill8 = _mm256_set1_ps(is_max ? -INFINITY : 0.0f);
    int64_t offsets[64];
    for (int64_t b = 0; b < fg->band_count; ++b) {
        const int64_t *band = fg->bands + 4 * b;
        const int64_t start = band[0] * w, end = band[1] * w, fy = band[2], count = band[3] - fy;
        for (int64_t r = 0; r < count; ++r)
            offsets[r] = ((fy + r) * gm->dil_h - gm->pad_top) * w;
        for (int64_t next = start; next < end; next += 8) {
            const int64_t i = next + 8 <= end ? next : end - 8;
            const __m256i left = _mm256_loadu_si256((const __m256i *)(fg->mask + i));
            const __m256i right =
                _mm256_loadu_si256((const __m256i *)(fg->mask + 2 * (plane + FLAT_MASK_ROOM) + i));
            const float *p = xp + i + offsets[0];
            __m256 l = _mm256_maskload_ps(p - 1, left), c = _mm256_loadu_ps(p),
                   h = _mm256_maskload_ps(p + 1, right);
            for (int64_t r = 1; r < count; ++r) {
                p = xp + i + offsets[r];
                __m256 lr = _mm256_maskload_ps(p - 1, left), cr = _mm256_loadu_ps(p),
                       hr = _mm256_maskload_ps(p + 1, right);
                if (is_max) {
                    l = max_nan8(l, lr), c = max_nan8(c, cr), h = max_nan8(h, hr);
                } else {
                    l = _mm256_add_ps(l, lr), c = _mm256_add_ps(c, cr), h = _mm256_add_ps(h, hr);
                }
            }
            __m256 out;
            if (is_max) {
                l = _mm256_blendv_ps(fill8, l, _mm256_castsi256_ps(left));
                h = _mm256_blendv_ps(fill8, h, _mm256_castsi256_ps(right));
                out = max_nan8(max_nan8(l, c), h);
            } else { /* masked lanes loaded as 0, the sum's fill */
                out = _mm256_div_ps(_mm256_add_ps(_mm256_add_ps(l, c), h),
                                    _mm256_loadu_ps(fg->divisor + i));
            }
            _mm256_storeu_ps(yp + i, out);
        }
    }
}

/* AVX-512 paths: 16 lanes, and lane masks in k registers, whose masked loads read nothing (and
 * fault on nothing) in the lanes they leave out and put the fill there, so the row ends and
 * the padding need no blends and no scalar code. */

/* The lanes i of 16 with 0 <= c0 + i < n. */
static inline __mmask16 lanes_inside16(int64_t c0, int64_t n)
{
    int64_t lo = c0 < 0 ? -c0 : 0, hi = n - c0;
    if (hi > 16)
        hi = 16;
    if (hi <= lo)
        return 0;
    return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* The first n lanes of 16 (all for n >= 16). */
static inline __mmask16 first_lanes16(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* max_nan on 16 lanes: _mm512_max_ps gives its second operand when either is NaN.  (VRANGEPS's
 * max does not help: it returns the other operand of a quiet NaN.) */
AVX512 static inline __m512 max_nan16(__m512 m, __m512 v)
{
    __m512 r = _mm512_max_ps(v, m);
    return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
}

AVX512 static inline __m512 reduce16(int is_max, __m512 m, __m512 v)
{
    return is_max ? max_nan16(m, v) : _mm512_add_ps(m, v);
}

/* Input columns c0 .. c0 + 15 of rows[0..count) reduced in row order, the fill outside the row
 * (in_w columns) and where no row is inside. */
AVX512 static inline __m512 window_rows16(int is_max, const float *const *rows, int64_t count,
                                          int64_t c0, int64_t in_w, __m512 fill)
{
    __mmask16 inside = lanes_inside16(c0, in_w);
    if (count == 0 || inside == 0)
        return fill;
    /* c0 may be negative: the lanes before the row are masked off, so nothing there is read */
    __m512 m = _mm512_mask_loadu_ps(fill, inside, rows[0] + c0);
    for (int64_t r = 1; r < count; ++r)
        m = reduce16(is_max, m, _mm512_mask_loadu_ps(fill, inside, rows[r] + c0));
    return m;
}

/* pool_plane for stride 2 with 2 or 3 taps along x (no dilation), any width and left padding:
 * per output row, 16 outputs take padded columns 2o .. 2o + 32, reduced over the window's rows
 * into three vectors of 16 (the third's first lane only is used, and it is the next block's
 * first), then even and odd lanes picked by two-source permutes, in pool_plane's order. */
AVX512 static void pool_plane_s2_avx512(const pool_geometry *gm, const float *xp, float *yp,
                                        const float *col_count)
{
    const int64_t in_w = gm->in_w, out_w = gm->out_w, pad_left = gm->pad_left;
    const int is_max = gm->is_max, three = gm->k_w == 3;
    const __m512 fill = _mm512_set1_ps(is_max ? -INFINITY : 0.0f), one = _mm512_set1_ps(1.0f);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                           30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29,
                                          31);
    const float *rows[64];
    for (int64_t oy = 0; oy < gm->out_h; ++oy) {
        int64_t y0 = oy * gm->stride_h - gm->pad_top, fy, ly, py0, py1;
        window_taps_inside(y0, gm->k_h, gm->dil_h, 0, gm->in_h, &fy, &ly);
        for (int64_t ky = fy; ky < ly; ++ky) rows[ky - fy] = xp + (y0 + ky * gm->dil_h) * in_w;
        const int64_t count = ly - fy;
        float rows_counted = (float)count;
        if (!is_max && gm->count_include_pad) {
            window_taps_inside(y0, gm->k_h, gm->dil_h, -gm->pad_top, gm->in_h + gm->pad_bottom,
                               &py0, &py1);
            rows_counted = (float)(py1 - py0);
        }
        const __m512 row_count = _mm512_set1_ps(rows_counted);
        float *yrow = yp + oy * out_w;
        __m512 lo = window_rows16(is_max, rows, count, -pad_left, in_w, fill);
        for (int64_t o0 = 0; o0 < out_w; o0 += 16) {
            const int64_t c0 = 2 * o0 - pad_left;
            const __mmask16 store = first_lanes16(out_w - o0);
            __m512 hi = window_rows16(is_max, rows, count, c0 + 16, in_w, fill);
            __m512 e = _mm512_permutex2var_ps(lo, even, hi);
            __m512 r = reduce16(is_max, e, _mm512_permutex2var_ps(lo, odd, hi));
            if (three || o0 + 16 < out_w)
                lo = window_rows16(is_max, rows, count, c0 + 32, in_w, fill);
            if (three) /* column 2o + 2: e moved down a lane, then the next block's first */
                r = reduce16(is_max, r, _mm512_castsi512_ps(_mm512_alignr_epi32(
                                            _mm512_castps_si512(lo), _mm512_castps_si512(e), 1)));
            if (!is_max)
                r = _mm512_div_ps(r, _mm512_mul_ps(row_count,
                                                   _mm512_mask_loadu_ps(one, store, col_count + o0)));
            _mm512_mask_storeu_ps(yrow + o0, store, r);
        }
    }
}

/* pool_plane_s2_avx512 for rows of at most 32 outputs: each output row's window rows are
 * reduced in up to five registers, whose masks are worked out once per plane, and then their
 * columns, with the loops unrolled (blocks, 1 or 2 sixteens of outputs, a constant where
 * inlined): the general loop's per-vector masks and row loops cost it the narrow planes (128
 * planes of 55x55: 94 us against the AVX2 register path's 79). */
AVX512 static inline __attribute__((always_inline)) void
s2_narrow_plane_avx512(const pool_geometry *gm, const float *xp, float *yp, const float *col_count,
                       const int blocks, const int is_max, const int three)
{
    const int64_t in_w = gm->in_w, out_w = gm->out_w, pad_left = gm->pad_left;
    const __m512 fill = _mm512_set1_ps(is_max ? -INFINITY : 0.0f), one = _mm512_set1_ps(1.0f);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                           30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29,
                                          31);
    __mmask16 inside[5];
    for (int j = 0; j <= 2 * blocks; ++j) inside[j] = lanes_inside16(16 * j - pad_left, in_w);
    for (int64_t oy = 0; oy < gm->out_h; ++oy) {
        int64_t y0 = oy * gm->stride_h - gm->pad_top, fy, ly, py0, py1;
        window_taps_inside(y0, gm->k_h, gm->dil_h, 0, gm->in_h, &fy, &ly);
        __m512 v[5] = {fill, fill, fill, fill, fill};
        for (int64_t ky = fy; ky < ly; ++ky) {
            /* the columns before the row (left padding) are masked off: nothing there is read */
            const float *row = xp + (y0 + ky * gm->dil_h) * in_w - pad_left;
            for (int j = 0; j <= 2 * blocks; ++j) {
                if (inside[j] == 0)
                    continue;
                __m512 a = _mm512_mask_loadu_ps(fill, inside[j], row + 16 * j);
                v[j] = ky == fy ? a : reduce16(is_max, v[j], a);
            }
        }
        float rows = (float)(ly - fy);
        if (!is_max && gm->count_include_pad) {
            window_taps_inside(y0, gm->k_h, gm->dil_h, -gm->pad_top, gm->in_h + gm->pad_bottom,
                               &py0, &py1);
            rows = (float)(py1 - py0);
        }
        for (int b = 0; b < blocks; ++b) {
            const int64_t o0 = 16 * b;
            const __mmask16 store = first_lanes16(out_w - o0);
            __m512 lo = v[2 * b], hi = v[2 * b + 1];
            __m512 e = _mm512_permutex2var_ps(lo, even, hi);
            __m512 r = reduce16(is_max, e, _mm512_permutex2var_ps(lo, odd, hi));
            if (three)
                r = reduce16(is_max, r, _mm512_castsi512_ps(_mm512_alignr_epi32(
                                            _mm512_castps_si512(v[2 * b + 2]),
                                            _mm512_castps_si512(e), 1)));
            if (!is_max)
                r = _mm512_div_ps(r, _mm512_mul_ps(_mm512_set1_ps(rows),
                                                   _mm512_mask_loadu_ps(one, store, col_count + o0)));
            _mm512_mask_storeu_ps(yp + oy * out_w + o0, store, r);
        }
    }
}

AVX512 static void pool_plane_s2_narrow_avx512(const pool_geometry *gm, const float *xp,
                                               float *yp, const float *col_count)
{
    /* blocks, the reduction and the taps as constants: each combination its own loop */
    const int three = gm->k_w == 3, key = 4 * (gm->out_w > 16) + 2 * gm->is_max + three;
    switch (key) {
    case 0: s2_narrow_plane_avx512(gm, xp, yp, col_count, 1, 0, 0); break;
    case 1: s2_narrow_plane_avx512(gm, xp, yp, col_count, 1, 0, 1); break;
    case 2: s2_narrow_plane_avx512(gm, xp, yp, col_count, 1, 1, 0); break;
    case 3: s2_narrow_plane_avx512(gm, xp, yp, col_count, 1, 1, 1); break;
    case 4: s2_narrow_plane_avx512(gm, xp, yp, col_count, 2, 0, 0); break;
    case 5: s2_narrow_plane_avx512(gm, xp, yp, col_count, 2, 0, 1); break;
    case 6: s2_narrow_plane_avx512(gm, xp, yp, col_count, 2, 1, 0); break;
    default: s2_narrow_plane_avx512(gm, xp, yp, col_count, 2, 1, 1);
    }
}

/* pool_plane_flat3_avx2 on 16 lanes, for any row width: a band's last vector is cut short by
 * a lane mask (not moved back), and the outer taps' masks leave out the padding columns. */
AVX512 static void pool_plane_flat3_avx512(const pool_geometry *gm, const flat_geometry *fg,
                                           const float *xp, float *yp)
{
    const int64_t w = gm->in_w, room = fg->plane + FLAT_MASK_ROOM;
    const int is_max = gm->is_max;
    const __m512 fill = _mm512_set1_ps(is_max ? -INFINITY : 0.0f), one = _mm512_set1_ps(1.0f);
    int64_t offsets[64];
    for (int64_t b = 0; b < fg->band_count; ++b) {
        const int64_t *band = fg->bands + 4 * b;
        const int64_t start = band[0] * w, end = band[1] * w, fy = band[2], count = band[3] - fy;
        for (int64_t r = 0; r < count; ++r)
            offsets[r] = ((fy + r) * gm->dil_h - gm->pad_top) * w;
        for (int64_t i = start; i < end; i += 16) {
            const __mmask16 lanes = first_lanes16(end - i);
            const __mmask16 left = lanes & _mm512_movepi32_mask(
                                               _mm512_loadu_si512((const void *)(fg->mask + i)));
            const __mmask16 right = lanes & _mm512_movepi32_mask(_mm512_loadu_si512(
                                                (const void *)(fg->mask + 2 * room + i)));
            const float *p = xp + i + offsets[0];
            __m512 l = _mm512_mask_loadu_ps(fill, left, p - 1),
                   c = _mm512_mask_loadu_ps(fill, lanes, p),
                   h = _mm512_mask_loadu_ps(fill, right, p + 1);
            for (int64_t r = 1; r < count; ++r) {
                p = xp + i + offsets[r];
                l = reduce16(is_max, l, _mm512_mask_loadu_ps(fill, left, p - 1));
                c = reduce16(is_max, c, _mm512_mask_loadu_ps(fill, lanes, p));
                h = reduce16(is_max, h, _mm512_mask_loadu_ps(fill, right, p + 1));
            }
            __m512 out = reduce16(is_max, reduce16(is_max, l, c), h);
            if (!is_max)
                out = _mm512_div_ps(out, _mm512_mask_loadu_ps(one, lanes, fg->divisor + i));
            _mm512_mask_storeu_ps(yp + i, lanes, out);
        }
    }
}

enum { FLAT_PLANE_LIMIT = 1 << 14, FLAT_TAPS_LIMIT = 16 };

/* pool2d_f32 by pool_plane_flat_avx2; 1 when it ran, 0 when the geometry is not its own, -1
 * when out of memory. */
static int pool_flat(const pool_geometry *gm, const float *x, int64_t planes, float *y,
                     const float *col_count, int threads)
{
    if (!have_avx2() || gm->stride_h != 1 || gm->stride_w != 1 || gm->dil_w != 1
        || gm->out_w != gm->in_w || gm->k_h > 64 || gm->k_w > FLAT_TAPS_LIMIT
        || gm->out_h * gm->out_w > FLAT_PLANE_LIMIT || gm->pad_left >= gm->k_w)
        return 0;
    const int64_t w = gm->in_w, plane = gm->out_h * w, k_w = gm->k_w;
    /* per thread: v with pad_left positions before it and k_w + 8 after */
    const int64_t per_thread = plane + 2 * k_w + 16;
    int32_t *mask = malloc(sizeof(int32_t) * (size_t)(k_w * (plane + FLAT_MASK_ROOM)));
    float *divisor = malloc(sizeof(float) * (size_t)(plane + 8));
    float *scratch = calloc((size_t)(per_thread * threads), sizeof(float));
    int64_t *bands = malloc(sizeof(int64_t) * 4 * (size_t)gm->out_h);
    if (mask == NULL || divisor == NULL || scratch == NULL || bands == NULL) {
        free(mask);
        free(divisor);
        free(scratch);
        free(bands);
        return -1;
    }
    /* the bands of output rows with the same inside taps, the same for every plane */
    int64_t band_count = 0;
    for (int64_t oy = 0; oy < gm->out_h; ++oy) {
        int64_t fy, ly;
        taps_inside(oy - gm->pad_top, gm->k_h, gm->dil_h, 0, gm->in_h, &fy, &ly);
        int64_t *last = bands + 4 * (band_count - 1);
        if (band_count > 0 && last[2] == fy && last[3] == ly) {
            last[1] = oy + 1;
        } else {
            int64_t *band = bands + 4 * band_count++;
            band[0] = oy, band[1] = oy + 1, band[2] = fy, band[3] = ly;
        }
    }
    for (int64_t kx = 0; kx < k_w; ++kx)
        for (int64_t i = 0; i < plane + FLAT_MASK_ROOM; ++i) {
            int64_t c = (i % w) + kx - gm->pad_left;
            mask[kx * (plane + FLAT_MASK_ROOM) + i] = i < plane && c >= 0 && c < w ? -1 : 0;
        }
    for (int64_t oy = 0; oy < gm->out_h; ++oy) {
        int64_t y0 = oy - gm->pad_top, fy, ly, py0, py1;
        taps_inside(y0, gm->k_h, gm->dil_h, 0, gm->in_h, &fy, &ly);
        taps_inside(y0, gm->k_h, gm->dil_h, -gm->pad_top, gm->in_h + gm->pad_bottom, &py0, &py1);
        float rows = (float)(gm->count_include_pad ? py1 - py0 : ly - fy);
        for (int64_t c = 0; c < w; ++c) divisor[oy * w + c] = rows * col_count[c];
    }
    for (int64_t i = plane; i < plane + 8; ++i) divisor[i] = 1.0f;
    flat_geometry fg = {plane, k_w, gm->pad_left, mask, divisor, bands, band_count};
    size_t in_plane = (size_t)gm->in_h * w;
    int three = k_w == 3 && gm->pad_left == 1;
    for (int64_t b = 0; b < band_count; ++b)
        three = three && bands[4 * b + 2] < bands[4 * b + 3];
    /* rows of 8 or more stay AVX2 (16 lanes measured no faster there); shorter rows, which
     * the AVX2 loop cannot take, go to the AVX-512 one */
    int three512 = three && w < 8 && have_avx512();
    three = three && w >= 8;
    PARALLEL_FOR(threads, for (int64_t p = 0; p < planes; ++p) {
        if (three512) {
            pool_plane_flat3_avx512(gm, &fg, x + p * in_plane, y + p * plane);
        } else if (three) {
            pool_plane_flat3_avx2(gm, &fg, x + p * in_plane, y + p * plane);
        } else {
            float *v = scratch + per_thread * omp_get_thread_num() + k_w;
            pool_plane_flat_avx2(gm, &fg, x + p * in_plane, y + p * plane, v);
        }
    });
    free(mask);
    free(divisor);
    free(scratch);
    free(bands);
    return 1;
}
#endif

/* One plane: per output row, its window's input rows reduced into t (the padded row, `width`
 * long, identity-filled outside the input), then t's windows along x; even and odd hold t's
 * even and odd columns for stride 2.  Built per CPU as a whole, so the row loops inline. */
VECTOR_CLONES
static void pool_plane(const pool_geometry *gm, const float *restrict xp, float *restrict yp,
                       float *restrict t, float *restrict even, float *restrict odd,
                       const float *restrict col_count)
{
    const int64_t in_w = gm->in_w, out_w = gm->out_w, k_w = gm->k_w, sw = gm->stride_w,
                  dw = gm->dil_w;
    const int is_max = gm->is_max;
    const float fill = is_max ? -INFINITY : 0.0f;
    const int s2k3 = sw == 2 && k_w == 3 && dw == 1;
    for (int64_t i = 0; i < gm->width; ++i) t[i] = fill;
    float *restrict inner = t + gm->pad_left;
    for (int64_t oy = 0; oy < gm->out_h; ++oy) {
        float *restrict yrow = yp + oy * out_w;
        int64_t y0 = oy * gm->stride_h - gm->pad_top, fy, ly;
        taps_inside(y0, gm->k_h, gm->dil_h, 0, gm->in_h, &fy, &ly);
        if (fy < ly) {
            const float *restrict first = xp + (y0 + fy * gm->dil_h) * in_w;
            for (int64_t i = 0; i < in_w; ++i) inner[i] = first[i];
        } else {
            for (int64_t i = 0; i < in_w; ++i) inner[i] = fill;
        }
        for (int64_t ky = fy + 1; ky < ly; ++ky) {
            const float *restrict row = xp + (y0 + ky * gm->dil_h) * in_w;
            if (is_max)
                for (int64_t i = 0; i < in_w; ++i) inner[i] = max_nan(inner[i], row[i]);
            else
                for (int64_t i = 0; i < in_w; ++i) inner[i] += row[i];
        }
        if (s2k3) {
            for (int64_t i = 0; i < out_w; ++i) {
                even[i] = t[2 * i];
                odd[i] = t[2 * i + 1];
            }
            even[out_w] = t[2 * out_w];
            if (is_max)
                for (int64_t o = 0; o < out_w; ++o)
                    yrow[o] = max_nan(max_nan(even[o], odd[o]), even[o + 1]);
            else
                for (int64_t o = 0; o < out_w; ++o) yrow[o] = (even[o] + odd[o]) + even[o + 1];
        } else {
            for (int64_t o = 0; o < out_w; ++o) yrow[o] = t[o * sw];
            for (int64_t kx = 1; kx < k_w; ++kx) {
                const float *restrict tap = t + kx * dw;
                if (is_max)
                    for (int64_t o = 0; o < out_w; ++o) yrow[o] = max_nan(yrow[o], tap[o * sw]);
                else
                    for (int64_t o = 0; o < out_w; ++o) yrow[o] += tap[o * sw];
            }
        }
        if (is_max)
            continue;
        int64_t py0, py1;
        taps_inside(y0, gm->k_h, gm->dil_h, -gm->pad_top, gm->in_h + gm->pad_bottom, &py0, &py1);
        double rows = (double)(gm->count_include_pad ? py1 - py0 : ly - fy);
        for (int64_t o = 0; o < out_w; ++o) yrow[o] /= (float)(rows * col_count[o]);
    }
}

static int avx2_ready(void)
{
#if defined(__x86_64__)
    return have_avx2();
#else
    return 0;
#endif
}

static int avx512_ready(void)
{
#if defined(__x86_64__)
    return have_avx512();
#else
    return 0;
#endif
}

enum { FAST_NONE, FAST_S2K3, FAST_S1, FAST_S2_NARROW, FAST_S2_AVX512, FAST_S2_NARROW_AVX512 };

/* One plane by an AVX-512 path (stride 2 with 2 or 3 taps), an AVX2 path (the same, or stride
 * 1) or pool_plane; t holds the padded row and the even and odd columns after it. */
static void pool_one_plane(const pool_geometry *gm, int fast, const float *xp, float *yp,
                           float *t, const float *col_count)
{
#if defined(__x86_64__)
    if (fast == FAST_S2_AVX512) {
        pool_plane_s2_avx512(gm, xp, yp, col_count);
        return;
    }
    if (fast == FAST_S2_NARROW_AVX512) {
        pool_plane_s2_narrow_avx512(gm, xp, yp, col_count);
        return;
    }
    if (fast == FAST_S2_NARROW) {
        pool_plane_s2_narrow_avx2(gm, xp, yp, col_count);
        return;
    }
    if (fast == FAST_S2K3) {
        pool_plane_s2k3_avx2(gm, xp, yp, t, col_count);
        return;
    }
    if (fast == FAST_S1) {
        pool_plane_s1_avx2(gm, xp, yp, t, col_count);
        return;
    }
#endif
    pool_plane(gm, xp, yp, t, t + gm->width, t + gm->width + gm->out_w + 2, col_count);
}

/* One window covering each whole plane, unpadded: a reduction of each plane. */
VECTOR_CLONES
static void pool_whole_planes(int is_max, const float *restrict x, float *restrict y,
                              int64_t planes, int64_t size)
{
    for (int64_t p = 0; p < planes; ++p) {
        const float *restrict xp = x + p * size;
        float m = xp[0];
        if (is_max) {
            for (int64_t i = 1; i < size; ++i) m = max_nan(m, xp[i]);
            y[p] = m;
        } else {
            float lanes[8] = {0};
            for (int64_t i = 0; i + 8 <= size; i += 8)
                for (int k = 0; k < 8; ++k) lanes[k] += xp[i + k];
            float total = 0.0f;
            for (int64_t i = size - size % 8; i < size; ++i) total += xp[i];
            for (int k = 0; k < 8; ++k) total += lanes[k];
            y[p] = total / (float)size;
        }
    }
}

int pool2d_f32(int kind, const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
               int64_t out_h, int64_t out_w, int64_t k_h, int64_t k_w, int64_t stride_h,
               int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t pad_bottom,
               int64_t pad_right, int64_t dil_h, int64_t dil_w, int count_include_pad)
{
    int is_max = kind == POOL_MAX;
    if (out_h == 1 && out_w == 1 && k_h == in_h && k_w == in_w && dil_h == 1 && dil_w == 1
        && pad_top == 0 && pad_left == 0 && pad_bottom == 0 && pad_right == 0) {
        int64_t size = in_h * in_w;
        int threads = threads_for((size_t)(planes * size));
        int64_t chunk = (planes + threads - 1) / threads;
        PARALLEL_FOR(threads, for (int64_t c = 0; c < threads; ++c) {
            int64_t lo = c * chunk, hi = lo + chunk < planes ? lo + chunk : planes;
            if (lo < hi)
                pool_whole_planes(is_max, x + lo * size, y + lo, hi - lo, size);
        });
        return 0;
    }
    int64_t span = (out_w - 1) * stride_w + (k_w - 1) * dil_w + 1;
    int64_t width = span > pad_left + in_w ? span : pad_left + in_w;
    if (width > PADDED_ROW_LIMIT || pad_left > PADDED_ROW_LIMIT) {
        if (is_max)
            return maxpool_by_taps(x, planes, in_h, in_w, y, out_h, out_w, k_h, k_w, stride_h,
                                   stride_w, pad_top, pad_left, dil_h, dil_w);
        return avgpool_by_taps(x, planes, in_h, in_w, y, out_h, out_w, k_h, k_w, stride_h,
                               stride_w, pad_top, pad_left, pad_bottom, pad_right, dil_h, dil_w,
                               count_include_pad);
    }
    pool_geometry gm = {in_h, in_w, out_h, out_w, k_h, k_w, stride_h, stride_w, pad_top,
                        pad_left, pad_bottom, dil_h, dil_w, width, is_max, count_include_pad};
    /* per thread: the padded row, then its even and odd columns */
    int64_t per_thread = width + 2 * (out_w + 2) + 32;
    size_t out_plane = (size_t)out_h * out_w, in_plane = (size_t)in_h * in_w;
    int threads = threads_for((size_t)planes * out_h * (in_w * k_h + out_w * k_w));
    float *scratch = malloc(sizeof(float) * (size_t)(per_thread * threads));
    float *col_count = malloc(sizeof(float) * (size_t)(out_w + 8));
    if (scratch == NULL || col_count == NULL) {
        free(scratch);
        free(col_count);
        return -1;
    }
    for (int64_t ox = 0; ox < out_w; ++ox)
        col_count[ox] = (float)column_taps(ox, k_w, stride_w, pad_left, pad_right, dil_w, in_w,
                                 count_include_pad);
    for (int64_t ox = out_w; ox < out_w + 8; ++ox) col_count[ox] = 1.0f;
#if defined(__x86_64__)
    int flat = pool_flat(&gm, x, planes, y, col_count, threads);
    if (flat != 0) {
        free(scratch);
        free(col_count);
        return flat < 0 ? -1 : 0;
    }
#endif
    int fast = FAST_NONE;
    int s2 = k_h <= 64 && stride_w == 2 && (k_w == 2 || k_w == 3) && dil_w == 1;
    if (avx512_ready() && s2)
        fast = out_w <= 32 ? FAST_S2_NARROW_AVX512 : FAST_S2_AVX512;
    else if (avx2_ready() && stride_w == 2 && (k_w == 2 || k_w == 3) && dil_w == 1
        && pad_left == 0 && in_w <= 64 && out_w <= 32)
        fast = FAST_S2_NARROW;
    else if (avx2_ready() && k_h <= 64 && stride_w == 2 && (k_w == 2 || k_w == 3) && dil_w == 1)
        fast = FAST_S2K3;
    else if (avx2_ready() && k_h <= 64 && stride_w == 1)
        fast = FAST_S1;
    PARALLEL_FOR(threads, for (int64_t p = 0; p < planes; ++p) {
        float *t = scratch + per_thread * omp_get_thread_num();
        pool_one_plane(&gm, fast, x + p * in_plane, y + p * out_plane, t, col_count);
    });
    free(scratch);
    free(col_count);
    return 0;
}

int maxpool2d_f32(const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
                  int64_t out_h, int64_t out_w, int64_t k_h, int64_t k_w, int64_t stride_h,
                  int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t dil_h,
                  int64_t dil_w)
{
    return pool2d_f32(POOL_MAX, x, planes, in_h, in_w, y, out_h, out_w, k_h, k_w, stride_h,
                      stride_w, pad_top, pad_left, 0, 0, dil_h, dil_w, 0);
}

int avgpool2d_f32(const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
                  int64_t out_h, int64_t out_w, int64_t k_h, int64_t k_w, int64_t stride_h,
                  int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t pad_bottom,
                  int64_t pad_right, int64_t dil_h, int64_t dil_w, int count_include_pad)
{
    return pool2d_f32(POOL_AVERAGE, x, planes, in_h, in_w, y, out_h, out_w, k_h, k_w, stride_h,
                      stride_w, pad_top, pad_left, pad_bottom, pad_right, dil_h, dil_w,
                      count_include_pad);
}
