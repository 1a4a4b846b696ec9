/* GEMV for decoding: y (m x n) = act(alpha * a @ op(b) + beta * c) for a few rows of a
 * (m <= 4) over a weight used where it lies, with no copy: b stored n x k (trans_b: each
 * output column's k weights contiguous, read as dot products) or k x n (read row by row, each
 * row's slice of a block of columns added into accumulators that stay in L1).  The work is
 * bound by streaming b from memory, so each thread takes a contiguous range of output columns
 * and reads its part of b once, for all rows of a together; a k x n weight with short rows is
 * cut by rows instead (GEMV_PART_FLOATS below).  Each y element is summed in an order fixed by
 * the shape alone: the result does not depend on the thread count. */
#include <math.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"

/* Below this many weight bytes per thread a second thread costs more than it saves (the
 * parallel region's start and the loss of the other core's cache).  Not settled by
 * measurement: on this 2-core machine at load average 8 (other work), 5 calls back to back at
 * M=1 gave 1 thread 54.9 GB/s, 2 threads 18.7 on 768 x 768, 52.6 vs 32.2 on 768 x 3072 and
 * 17.0 vs 17.6 on 768 x 50257 (the second thread waits for a core); the split is what an idle
 * machine needs to stream on both cores, and wants measuring there. */
enum { GEMV_MIN_BYTES_PER_THREAD = 1 << 17, GEMV_ROW_ALIGN = 8 };

/* A weight stored k x n whose rows are short (a decoder's 512 x 128 k/v projection, its
 * 1408 x 512 down projection) is cut by its rows into parts, not by its columns: a thread then
 * streams whole rows, one contiguous run of memory, where a split by columns gave each thread
 * a short piece of every row (on 2 threads, 256 bytes of each 512-byte row) and both threads
 * touched every page.  Each part is summed on its own into a buffer on the caller's stack
 * (GEMV_PART_FLOATS: m * n * parts at most) and the parts are added in order; their number
 * (a power of two, at most GEMV_MAX_PARTS, parts of GEMV_PART_ROWS rows or more) and rows come
 * from the shape alone, so the result does not depend on the threads. */
enum { GEMV_PART_FLOATS = 16384, GEMV_PART_ROWS = 64, GEMV_MAX_PARTS = 16 };

/* out[i * n_out + r] = dot(a row i, w row r), r < rows, i < m (portable). */
static void dots_portable(const float *w, int64_t k, int rows, const float *a, int64_t lda, int m,
                          float *out, int n_out)
{
    for (int i = 0; i < m; ++i)
        for (int r = 0; r < rows; ++r) {
            const float *wr = w + r * k, *ai = a + i * lda;
            float s = 0.0f;
            for (int64_t t = 0; t < k; ++t)
                s += ai[t] * wr[t];
            out[i * n_out + r] = s;
        }
}

#if defined(__x86_64__)
/* As dots_portable for ROWS rows of w and M rows of a, with ROWS * M accumulators of 8 lanes;
 * the last k % 8 products are added one by one after the lanes are summed. */
#define DEFINE_DOTS(ROWS, M)                                                                   \
    AVX2 static void dots_##ROWS##x##M(const float *w, int64_t k, const float *a, int64_t lda, \
                                       float *out, int n_out)                                 \
    {                                                                                          \
        __m256 acc[M][ROWS];                                                                   \
        for (int i = 0; i < M; ++i)                                                            \
            for (int r = 0; r < ROWS; ++r) acc[i][r] = _mm256_setzero_ps();                    \
        int64_t body = k & ~(int64_t)7;                                                        \
        for (int64_t t = 0; t < body; t += 8) {                                                \
            __m256 wv[ROWS];                                                                   \
            for (int r = 0; r < ROWS; ++r) wv[r] = _mm256_loadu_ps(w + r * k + t);             \
            for (int i = 0; i < M; ++i) {                                                      \
                __m256 av = _mm256_loadu_ps(a + i * lda + t);                                  \
                for (int r = 0; r < ROWS; ++r) acc[i][r] = _mm256_fmadd_ps(av, wv[r], acc[i][r]); \
            }                                                                                  \
        }                                                                                      \
        for (int i = 0; i < M; ++i)                                                            \
            for (int r = 0; r < ROWS; ++r) {                                                   \
                float s = hsum256(acc[i][r]);                                                    \
                for (int64_t t = body; t < k; ++t) s += a[i * lda + t] * w[r * k + t];         \
                out[i * n_out + r] = s;                                                        \
            }                                                                                  \
    }

DEFINE_DOTS(4, 1)
DEFINE_DOTS(4, 2)
DEFINE_DOTS(2, 3)
DEFINE_DOTS(2, 4)
DEFINE_DOTS(1, 1)
DEFINE_DOTS(1, 2)
DEFINE_DOTS(1, 3)
DEFINE_DOTS(1, 4)

/* Rows of w taken together per pass for m rows of a: as many as leave the accumulators in
 * registers (16 ymm: rows * m accumulators, rows loads, one of a). */
static int rows_per_pass(int m)
{
    return m <= 2 ? 4 : 2;
}

/* rows (at most rows_per_pass(m), or 1) of w against m rows of a. */
static void dots_avx2(const float *w, int64_t k, int rows, const float *a, int64_t lda, int m,
                      float *out, int n_out)
{
    if (rows == rows_per_pass(m)) {
        switch (m) {
        case 1: dots_4x1(w, k, a, lda, out, n_out); return;
        case 2: dots_4x2(w, k, a, lda, out, n_out); return;
        case 3: dots_2x3(w, k, a, lda, out, n_out); return;
        default: dots_2x4(w, k, a, lda, out, n_out); return;
        }
    }
    for (int r = 0; r < rows; ++r) {
        switch (m) {
        case 1: dots_1x1(w + r * k, k, a, lda, out + r, n_out); break;
        case 2: dots_1x2(w + r * k, k, a, lda, out + r, n_out); break;
        case 3: dots_1x3(w + r * k, k, a, lda, out + r, n_out); break;
        default: dots_1x4(w + r * k, k, a, lda, out + r, n_out); break;
        }
    }
}
#endif

/* Accumulators of one pass: GEMV_F32_MAX_ROWS * GEMV_COLUMN_BLOCK floats (16 KiB, in L1
 * beside the rows of b being read), as many columns as that leaves for m rows of a. */
enum { GEMV_COLUMN_BLOCK = 1024 };

/* acc[i * cols + j] += a[i][t] * b[t][j] for t < k, one t after another (b rows n apart). */
static void axpy_portable(const float *b, int64_t n, int64_t k, int cols, const float *a,
                          int64_t lda, int m, float *acc)
{
    for (int64_t t = 0; t < k; ++t)
        for (int i = 0; i < m; ++i) {
            float av = a[i * lda + t], *yi = acc + i * cols;
            const float *row = b + t * n;
            for (int j = 0; j < cols; ++j)
                yi[j] += av * row[j];
        }
}

#if defined(__x86_64__)
/* As axpy_portable with fused multiply-adds, eight rows of b per pass over the accumulators
 * (then four, then one): each accumulator takes its products in the order of t either way, so
 * the pass width changes how often the accumulators go through L1, not the result. */
AVX2 static void axpy_avx2(const float *b, int64_t n, int64_t k, int cols, const float *a,
                           int64_t lda, int m, float *acc)
{
    int body = cols & ~7;
    int64_t t = 0;
    for (; t + 8 <= k; t += 8) {
        const float *r0 = b + t * n, *r1 = r0 + n, *r2 = r1 + n, *r3 = r2 + n;
        const float *r4 = r3 + n, *r5 = r4 + n, *r6 = r5 + n, *r7 = r6 + n;
        for (int i = 0; i < m; ++i) {
            const float *ai = a + i * lda + t;
            float *yi = acc + i * cols;
            __m256 a0 = _mm256_set1_ps(ai[0]), a1 = _mm256_set1_ps(ai[1]);
            __m256 a2 = _mm256_set1_ps(ai[2]), a3 = _mm256_set1_ps(ai[3]);
            __m256 a4 = _mm256_set1_ps(ai[4]), a5 = _mm256_set1_ps(ai[5]);
            __m256 a6 = _mm256_set1_ps(ai[6]), a7 = _mm256_set1_ps(ai[7]);
            for (int j = 0; j < body; j += 8) {
                __m256 y = _mm256_loadu_ps(yi + j);
                y = _mm256_fmadd_ps(a0, _mm256_loadu_ps(r0 + j), y);
                y = _mm256_fmadd_ps(a1, _mm256_loadu_ps(r1 + j), y);
                y = _mm256_fmadd_ps(a2, _mm256_loadu_ps(r2 + j), y);
                y = _mm256_fmadd_ps(a3, _mm256_loadu_ps(r3 + j), y);
                y = _mm256_fmadd_ps(a4, _mm256_loadu_ps(r4 + j), y);
                y = _mm256_fmadd_ps(a5, _mm256_loadu_ps(r5 + j), y);
                y = _mm256_fmadd_ps(a6, _mm256_loadu_ps(r6 + j), y);
                y = _mm256_fmadd_ps(a7, _mm256_loadu_ps(r7 + j), y);
                _mm256_storeu_ps(yi + j, y);
            }
            for (int j = body; j < cols; ++j) {
                float y = fmaf(ai[3], r3[j], fmaf(ai[2], r2[j], fmaf(ai[1], r1[j],
                                                                    fmaf(ai[0], r0[j], yi[j]))));
                yi[j] = fmaf(ai[7], r7[j], fmaf(ai[6], r6[j], fmaf(ai[5], r5[j],
                                                                  fmaf(ai[4], r4[j], y))));
            }
        }
    }
    for (; t + 4 <= k; t += 4) {
        const float *r0 = b + t * n, *r1 = r0 + n, *r2 = r1 + n, *r3 = r2 + n;
        for (int i = 0; i < m; ++i) {
            const float *ai = a + i * lda + t;
            float *yi = acc + i * cols;
            __m256 a0 = _mm256_set1_ps(ai[0]), a1 = _mm256_set1_ps(ai[1]);
            __m256 a2 = _mm256_set1_ps(ai[2]), a3 = _mm256_set1_ps(ai[3]);
            for (int j = 0; j < body; j += 8) {
                __m256 y = _mm256_loadu_ps(yi + j);
                y = _mm256_fmadd_ps(a0, _mm256_loadu_ps(r0 + j), y);
                y = _mm256_fmadd_ps(a1, _mm256_loadu_ps(r1 + j), y);
                y = _mm256_fmadd_ps(a2, _mm256_loadu_ps(r2 + j), y);
                y = _mm256_fmadd_ps(a3, _mm256_loadu_ps(r3 + j), y);
                _mm256_storeu_ps(yi + j, y);
            }
            for (int j = body; j < cols; ++j)
                yi[j] = fmaf(ai[3], r3[j], fmaf(ai[2], r2[j], fmaf(ai[1], r1[j],
                                                                    fmaf(ai[0], r0[j], yi[j]))));
        }
    }
    for (; t < k; ++t) {
        const float *r0 = b + t * n;
        for (int i = 0; i < m; ++i) {
            float av = a[i * lda + t], *yi = acc + i * cols;
            __m256 a0 = _mm256_set1_ps(av);
            for (int j = 0; j < body; j += 8)
                _mm256_storeu_ps(yi + j, _mm256_fmadd_ps(a0, _mm256_loadu_ps(r0 + j),
                                                         _mm256_loadu_ps(yi + j)));
            for (int j = body; j < cols; ++j)
                yi[j] = fmaf(av, r0[j], yi[j]);
        }
    }
}
#endif

/* y[i][j0 + r] = alpha * sums[i * ld + r] + beta * c[i][j0 + r] for r < cols. */
static void finish(int m, int64_t j0, int cols, const float *sums, int ld, float alpha,
                   float beta, const float *c, int64_t c_rs, int64_t c_cs, float *y, int64_t n)
{
    for (int i = 0; i < m; ++i)
        for (int r = 0; r < cols; ++r) {
            float v = alpha * sums[i * ld + r];
            if (c != NULL)
                v += beta * c[i * c_rs + (j0 + r) * c_cs];
            y[i * n + j0 + r] = v;
        }
}

typedef struct {
    int trans_b, m, simd, act;
    int64_t n, k, lda, c_rs, c_cs;
    float alpha, beta, act_alpha, act_beta;
    const float *a, *b, *c;
    float *y;
} gemv_args;

/* Columns [start, start + len) of y, b stored n x k. */
static void dot_range(const gemv_args *g, int64_t start, int64_t len)
{
    int m = g->m, step = 1;
#if defined(__x86_64__)
    if (g->simd)
        step = rows_per_pass(m);
#endif
    float dots[GEMV_F32_MAX_ROWS * 4];
    for (int64_t j = start; j < start + len; j += step) {
        int rows = start + len - j < step ? 1 : step;
        if (rows < step)
            step = 1; /* the tail, one row of b at a time */
        const float *w = g->b + j * g->k;
#if defined(__x86_64__)
        if (g->simd)
            dots_avx2(w, g->k, rows, g->a, g->lda, m, dots, 4);
        else
#endif
            dots_portable(w, g->k, rows, g->a, g->lda, m, dots, 4);
        finish(m, j, rows, dots, 4, g->alpha, g->beta, g->c, g->c_rs, g->c_cs, g->y, g->n);
    }
}

/* Columns [start, start + len) of y, b stored k x n. */
static void axpy_range(const gemv_args *g, int64_t start, int64_t len)
{
    float acc[GEMV_F32_MAX_ROWS * GEMV_COLUMN_BLOCK];
    /* as wide as the accumulators allow for m rows (longer runs of each row of b read at
     * once), in blocks of equal width (a multiple of 8): no short block reads a row's end alone */
    int64_t widest = GEMV_F32_MAX_ROWS * GEMV_COLUMN_BLOCK / g->m;
    int64_t blocks = (len + widest - 1) / widest;
    int64_t width = ((len + blocks - 1) / blocks + 7) / 8 * 8;
    for (int64_t j = start; j < start + len; j += width) {
        int cols = (int)(start + len - j < width ? start + len - j : width);
        for (int i = 0; i < g->m * cols; ++i)
            acc[i] = 0.0f;
#if defined(__x86_64__)
        if (g->simd)
            axpy_avx2(g->b + j, g->n, g->k, cols, g->a, g->lda, g->m, acc);
        else
#endif
            axpy_portable(g->b + j, g->n, g->k, cols, g->a, g->lda, g->m, acc);
        finish(g->m, j, cols, acc, cols, g->alpha, g->beta, g->c, g->c_rs, g->c_cs, g->y, g->n);
    }
}

static void gemv_range(const gemv_args *g, int64_t start, int64_t len)
{
    if (g->trans_b)
        dot_range(g, start, len);
    else
        axpy_range(g, start, len);
    if (g->act != ACT_NONE)
        for (int i = 0; i < g->m; ++i)
            activate_inplace(g->y + i * g->n + start, (size_t)len, g->act, g->act_alpha,
                             g->act_beta);
}

/* Rows per part where b (k x n) is cut by rows for m rows of a, or 0 where it is not. */
static int64_t part_rows(int m, int64_t n, int64_t k)
{
    int64_t most = k / GEMV_PART_ROWS, room = GEMV_PART_FLOATS / ((int64_t)m * (n > 0 ? n : 1));
    if (most > room) most = room;
    int64_t parts = 1;
    while (parts * 2 <= most && parts * 2 <= GEMV_MAX_PARTS)
        parts *= 2; /* a power of two: as many parts on each of 2, 4 or 8 threads */
    if (parts < 2)
        return 0;
    return ((k + parts - 1) / parts + 7) / 8 * 8;
}

/* The sums over rows [t0, t0 + rows) of b for every column, into part (m x n). */
static void k_part(const gemv_args *g, int64_t t0, int64_t rows, float *part)
{
    for (int64_t i = 0; i < g->m * g->n; ++i)
        part[i] = 0.0f;
#if defined(__x86_64__)
    if (g->simd)
        axpy_avx2(g->b + t0 * g->n, g->n, rows, (int)g->n, g->a + t0, g->lda, g->m, part);
    else
#endif
        axpy_portable(g->b + t0 * g->n, g->n, rows, (int)g->n, g->a + t0, g->lda, g->m, part);
}

/* y from b stored k x n cut into parts of `rows` rows (see GEMV_PART_FLOATS), each thread
 * taking a contiguous range of them; the parts are then added in order. */
static void gemv_by_rows(const gemv_args *g, int64_t rows, int threads)
{
    float sums[GEMV_PART_FLOATS];
    int64_t size = (int64_t)g->m * g->n, parts = (g->k + rows - 1) / rows;
    if (threads > parts)
        threads = (int)parts;
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
        for (int64_t p = t * parts / count; p < (t + 1) * parts / count; ++p) {
            int64_t t0 = p * rows;
            k_part(g, t0, g->k - t0 < rows ? g->k - t0 : rows, sums + p * size);
        }
    }
    for (int64_t p = 1; p < parts; ++p)
        for (int64_t i = 0; i < size; ++i)
            sums[i] += sums[p * size + i];
    finish(g->m, 0, (int)g->n, sums, (int)g->n, g->alpha, g->beta, g->c, g->c_rs, g->c_cs, g->y,
           g->n);
    if (g->act != ACT_NONE)
        for (int i = 0; i < g->m; ++i)
            activate_inplace(g->y + i * g->n, (size_t)g->n, g->act, g->act_alpha, g->act_beta);
}

static int gemv_threads(int64_t n, int64_t k)
{
    int64_t useful = n * k * (int64_t)sizeof(float) / GEMV_MIN_BYTES_PER_THREAD;
    int64_t by_rows = n / GEMV_ROW_ALIGN;
    int threads = kernels_get_num_threads();
    if (useful > by_rows)
        useful = by_rows;
    if (useful < 2)
        return 1;
    return useful < threads ? (int)useful : threads;
}

int gemv_f32(int trans_b, int m, int64_t n, int64_t k, float alpha, const float *a,
             int64_t lda, const float *b, float beta, const float *c, int64_t c_row_stride,
             int64_t c_col_stride, float *y, int act, float act_alpha, float act_beta,
             int allow_simd)
{
    if (m < 1 || m > GEMV_F32_MAX_ROWS || n < 0 || k < 0)
        return -1;
    if (n == 0)
        return 0;
    int simd = 0;
#if defined(__x86_64__)
    simd = allow_simd && have_avx2();
#else
    (void)allow_simd;
#endif
    gemv_args g = {trans_b, m, simd, act, n, k, lda, c_row_stride, c_col_stride, alpha, beta,
                   act_alpha, act_beta, a, b, c, y};
    int threads = gemv_threads(n, k);
    int64_t rows = trans_b ? 0 : part_rows(m, n, k);
    if (rows > 0) {
        gemv_by_rows(&g, rows, threads);
        return 0;
    }
    if (threads == 1) {
        gemv_range(&g, 0, n);
        return 0;
    }
    #pragma omp parallel num_threads(threads)
    {
        int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
        int64_t per = ((n + count - 1) / count + GEMV_ROW_ALIGN - 1) / GEMV_ROW_ALIGN
                      * GEMV_ROW_ALIGN;
        int64_t start = t * per, len = n - start < per ? n - start : per;
        if (len > 0)
            gemv_range(&g, start, len);
    }
    return 0;
}
