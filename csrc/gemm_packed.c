/* GEMM over constant weights packed once: y (m x n) = act(alpha * a @ op(b) + beta * c).
 *
 * gemm_pack_b copies B (k x n, or n x k when transposed) once, when the plan is built, into
 * panels of PANEL_COLS columns: panel p holds rows 0..k-1 of columns p*16 .. p*16+15, one row
 * of 16 floats after the other, the last panel padded with zeros.  A run then reads each panel
 * front to back, never repacking it (the BLAS repacks B on every call).
 *
 * The kernel is a 6 x 16 register tile (12 AVX2 accumulators, FMA) over K blocks of K_BLOCK
 * rows, so that one block of a panel (16 KiB) stays in L1 while the tiles of every row of A
 * run over it.  Threads split the panels: each output column is summed in one fixed order
 * whatever the thread count, so results do not depend on it.  A is read where it lies (rows
 * lda apart).  Without AVX2 and FMA the portable loop runs the same panels.
 *
 * Chosen by measurement (2-core AMD EPYC, AVX2/FMA, 1 thread, a standalone C loop timing each
 * library on the same product in alternation, medians of 41; the machine was loaded, so the
 * ratios within a row hold better than the figures).  GFLOP/s:
 *
 *   M x K -> N          OpenBLAS sgemm   this kernel   oneDNN 3.2 matmul, weights reordered once
 *   37 x 192 -> 192          54               68              67
 *   37 x 192 -> 576          53               64              66
 *   37 x 768 -> 192          58               70              77
 *   128 x 256 -> 256         76               84              77
 *   128 x 256 -> 1024        83               85              38 (noisy)
 *   128 x 1024 -> 256        84               92              66
 *   128 x 768 -> 768         72               77              65
 *   128 x 768 -> 2304        84               85              44
 *   128 x 768 -> 3072        84               86              25
 *   128 x 3072 -> 768        76               78              44
 *
 * oneDNN 3.2 picks its "gemm:jit:f32" for matmul on AVX2 (no brgemm kernel without AVX-512),
 * which packs per call like the BLAS, so it is not used.  K blocks of 256 lost 10-20% to the
 * BLAS at M = 128 (the output read and written once per block); 1024 did not.  Spreading the
 * rows evenly over the tiles (37 rows: five of 5 and two of 6, not six of 6 and one of 1) and
 * unrolling the K loop by 4 then took 37 x 192 -> 192 from 68-83 to 82-89 GFLOP/s and
 * 128 x 768 -> 768 from 67-70 to 79 (two runs each, same process, alternating).
 *
 * Where the CPU has AVX-512 (run-time check) a tile of up to 12 rows runs two panels at once
 * (run_panels_avx512).  On the Zen 4 that has it, a 16-lane FMA costs as much as two 8-lane
 * ones, so the gain is in fewer loads and instructions a flop: against the AVX2 tile, one
 * process, alternating, 1 thread, CPU time, medians of 7 at load average 8, GFLOP/s:
 * 128 x 512 -> 512 89 -> 98, 128 x 1408 -> 512 95 -> 102, 128 x 512 -> 2816 91 -> 95,
 * 37 x 192 -> 192 86 -> 95, 5 x 512 -> 1408 87 -> 100, 128 x 768 -> 768 104 -> 104. */
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"

enum { PANEL_COLS = 16, TILE_ROWS = 6, K_BLOCK = 1024, MIN_FLOPS_PER_THREAD = 1 << 18 };

int64_t gemm_packed_b_floats(int64_t k, int64_t n)
{
    return k * ((n + PANEL_COLS - 1) / PANEL_COLS) * PANEL_COLS;
}

void gemm_pack_b(const float *b, int trans_b, int64_t k, int64_t n, float *packed)
{
    int64_t panels = (n + PANEL_COLS - 1) / PANEL_COLS;
    for (int64_t p = 0; p < panels; ++p) {
        float *dst = packed + p * k * PANEL_COLS;
        int64_t j0 = p * PANEL_COLS, cols = n - j0 < PANEL_COLS ? n - j0 : PANEL_COLS;
        for (int64_t r = 0; r < k; ++r) {
            float *row = dst + r * PANEL_COLS;
            for (int64_t j = 0; j < cols; ++j)
                row[j] = trans_b ? b[(j0 + j) * k + r] : b[r * n + j0 + j];
            for (int64_t j = cols; j < PANEL_COLS; ++j)
                row[j] = 0.0f;
        }
    }
}

typedef struct {
    int64_t m, n, k, lda;
    float alpha, beta;
    const float *a, *packed, *c;
    int64_t c_row_stride, c_col_stride;
    float *y;
    int act;
    float act_alpha, act_beta;
} packed_gemm;

/* The tile's last step: y = alpha * sum + beta * c, then the activation, for rows x cols. */
static void finish_tile(const packed_gemm *g, float *tile, int64_t ldt, int64_t i0, int64_t j0,
                        int rows, int cols)
{
    for (int r = 0; r < rows; ++r) {
        float *t = tile + r * ldt;
        for (int j = 0; j < cols; ++j)
            t[j] *= g->alpha;
        if (g->c != NULL) {
            const float *crow = g->c + (i0 + r) * g->c_row_stride + j0 * g->c_col_stride;
            for (int j = 0; j < cols; ++j)
                t[j] += g->beta * crow[j * g->c_col_stride];
        }
        if (g->act != ACT_NONE)
            activate_inplace(t, (size_t)cols, g->act, g->act_alpha, g->act_beta);
    }
}

/* Sums over k rows [k0, k0 + kc) for rows [i0, i0 + rows) and panel p: into y (first: set,
 * else add), finishing the tile after the last block. */
static void tile_portable(const packed_gemm *g, int64_t i0, int rows, int64_t p, int64_t k0,
                          int64_t kc)
{
    float acc[TILE_ROWS][PANEL_COLS] = {{0}};
    const float *bp = g->packed + p * g->k * PANEL_COLS + k0 * PANEL_COLS;
    for (int64_t r = 0; r < kc; ++r)
        for (int i = 0; i < rows; ++i) {
            float av = g->a[(i0 + i) * g->lda + k0 + r];
            for (int j = 0; j < PANEL_COLS; ++j)
                acc[i][j] += av * bp[r * PANEL_COLS + j];
        }
    int64_t j0 = p * PANEL_COLS;
    int cols = g->n - j0 < PANEL_COLS ? (int)(g->n - j0) : PANEL_COLS;
    for (int i = 0; i < rows; ++i) {
        float *yrow = g->y + (i0 + i) * g->n + j0;
        for (int j = 0; j < cols; ++j)
            yrow[j] = k0 == 0 ? acc[i][j] : yrow[j] + acc[i][j];
    }
    if (k0 + kc == g->k)
        finish_tile(g, g->y + i0 * g->n + j0, g->n, i0, j0, rows, cols);
}

#if defined(__x86_64__)

/* The AVX2 tile for a fixed row count (inlined per count, so the accumulators stay in
 * registers). */
AVX2 static inline __attribute__((always_inline)) void
tile_avx2_rows(const packed_gemm *g, int64_t i0, const int rows, int64_t p, int64_t k0,
               int64_t kc)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    const float *bp = g->packed + p * g->k * PANEL_COLS + k0 * PANEL_COLS;
    const float *a = g->a + i0 * g->lda + k0;
    int64_t lda = g->lda;
    #pragma GCC unroll 4
    for (int64_t r = 0; r < kc; ++r, bp += PANEL_COLS, ++a) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8), av;
#define ROW(i, lo, hi)                                                                             \
        if (rows > i) {                                                                            \
            av = _mm256_broadcast_ss(a + i * lda);                                                 \
            lo = _mm256_fmadd_ps(av, b0, lo);                                                      \
            hi = _mm256_fmadd_ps(av, b1, hi);                                                      \
        }
        ROW(0, c00, c01) ROW(1, c10, c11) ROW(2, c20, c21) ROW(3, c30, c31) ROW(4, c40, c41)
        ROW(5, c50, c51)
#undef ROW
    }
    int64_t j0 = p * PANEL_COLS;
    int cols = g->n - j0 < PANEL_COLS ? (int)(g->n - j0) : PANEL_COLS;
    int last = k0 + kc == g->k;
    __m256 sums[TILE_ROWS][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41},
                                 {c50, c51}};
    float tile[TILE_ROWS][PANEL_COLS];
    int direct = cols == PANEL_COLS;
    for (int i = 0; i < rows; ++i) {
        float *yrow = g->y + (i0 + i) * g->n + j0;
        if (direct) {
            __m256 lo = sums[i][0], hi = sums[i][1];
            if (k0 != 0) {
                lo = _mm256_add_ps(lo, _mm256_loadu_ps(yrow));
                hi = _mm256_add_ps(hi, _mm256_loadu_ps(yrow + 8));
            }
            _mm256_storeu_ps(yrow, lo);
            _mm256_storeu_ps(yrow + 8, hi);
        } else {
            _mm256_storeu_ps(tile[i], sums[i][0]);
            _mm256_storeu_ps(tile[i] + 8, sums[i][1]);
            for (int j = 0; j < cols; ++j)
                yrow[j] = k0 == 0 ? tile[i][j] : yrow[j] + tile[i][j];
        }
    }
    if (last && (g->alpha != 1.0f || g->c != NULL || g->act != ACT_NONE))
        finish_tile(g, g->y + i0 * g->n + j0, g->n, i0, j0, rows, cols);
}

AVX2 static void tile_avx2(const packed_gemm *g, int64_t i0, int rows, int64_t p, int64_t k0,
                           int64_t kc)
{
    switch (rows) {
    case 6: tile_avx2_rows(g, i0, 6, p, k0, kc); break;
    case 5: tile_avx2_rows(g, i0, 5, p, k0, kc); break;
    case 4: tile_avx2_rows(g, i0, 4, p, k0, kc); break;
    case 3: tile_avx2_rows(g, i0, 3, p, k0, kc); break;
    case 2: tile_avx2_rows(g, i0, 2, p, k0, kc); break;
    default: tile_avx2_rows(g, i0, 1, p, k0, kc); break;
    }
}

/* --- AVX-512: a tile of up to TILE_ROWS_512 rows by two panels ------------------------------
 * 32 vector registers hold 12 rows x 2 panels of accumulators (24), a panel row of each
 * panel and a broadcast of a: per step of k, 2 loads of the panels and 12 broadcasts feed 24
 * FMAs of 16 lanes (the AVX2 tile: 2 loads and 6 broadcasts a 12 FMAs of 8).  A tail of fewer
 * than 16 columns is stored under a mask. */
enum { TILE_ROWS_512 = 12 };

AVX512 static inline __attribute__((always_inline)) void
tile_avx512_rows(const packed_gemm *g, int64_t i0, const int rows, int64_t p, const int panels,
                 int64_t k0, int64_t kc)
{
    __m512 acc[TILE_ROWS_512][2];
    for (int i = 0; i < rows; ++i)
        for (int h = 0; h < panels; ++h) acc[i][h] = _mm512_setzero_ps();
    int64_t panel_floats = g->k * PANEL_COLS;
    const float *bp = g->packed + p * panel_floats + k0 * PANEL_COLS;
    const float *a = g->a + i0 * g->lda + k0;
    int64_t lda = g->lda;
    #pragma GCC unroll 2
    for (int64_t r = 0; r < kc; ++r, bp += PANEL_COLS, ++a) {
        __m512 b0 = _mm512_loadu_ps(bp);
        __m512 b1 = panels > 1 ? _mm512_loadu_ps(bp + panel_floats) : b0;
        for (int i = 0; i < rows; ++i) {
            __m512 av = _mm512_set1_ps(a[i * lda]);
            acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
            if (panels > 1)
                acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
        }
    }
    int last = k0 + kc == g->k;
    for (int h = 0; h < panels; ++h) {
        int64_t j0 = (p + h) * PANEL_COLS;
        int cols = g->n - j0 < PANEL_COLS ? (int)(g->n - j0) : PANEL_COLS;
        __mmask16 mask = (__mmask16)((1u << cols) - 1);
        for (int i = 0; i < rows; ++i) {
            float *yrow = g->y + (i0 + i) * g->n + j0;
            __m512 sum = acc[i][h];
            if (k0 != 0)
                sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask, yrow));
            _mm512_mask_storeu_ps(yrow, mask, sum);
        }
        if (last && (g->alpha != 1.0f || g->c != NULL || g->act != ACT_NONE))
            finish_tile(g, g->y + i0 * g->n + j0, g->n, i0, j0, rows, cols);
    }
}

#define TILE_AVX512_CASES(PANELS)                                                             \
    switch (rows) {                                                                           \
    case 12: tile_avx512_rows(g, i0, 12, p, PANELS, k0, kc); break;                           \
    case 11: tile_avx512_rows(g, i0, 11, p, PANELS, k0, kc); break;                           \
    case 10: tile_avx512_rows(g, i0, 10, p, PANELS, k0, kc); break;                           \
    case 9: tile_avx512_rows(g, i0, 9, p, PANELS, k0, kc); break;                             \
    case 8: tile_avx512_rows(g, i0, 8, p, PANELS, k0, kc); break;                             \
    case 7: tile_avx512_rows(g, i0, 7, p, PANELS, k0, kc); break;                             \
    case 6: tile_avx512_rows(g, i0, 6, p, PANELS, k0, kc); break;                             \
    case 5: tile_avx512_rows(g, i0, 5, p, PANELS, k0, kc); break;                             \
    case 4: tile_avx512_rows(g, i0, 4, p, PANELS, k0, kc); break;                             \
    case 3: tile_avx512_rows(g, i0, 3, p, PANELS, k0, kc); break;                             \
    case 2: tile_avx512_rows(g, i0, 2, p, PANELS, k0, kc); break;                             \
    default: tile_avx512_rows(g, i0, 1, p, PANELS, k0, kc); break;                            \
    }

/* rows (<= TILE_ROWS_512) of A against panels p .. p + panels - 1 (panels 1 or 2). */
AVX512 static void tile_avx512(const packed_gemm *g, int64_t i0, int rows, int64_t p,
                               int panels, int64_t k0, int64_t kc)
{
    if (panels == 2) {
        TILE_AVX512_CASES(2)
    } else {
        TILE_AVX512_CASES(1)
    }
}
#undef TILE_AVX512_CASES

/* Panels [p0, p1) over every row of A, K block by K block, two panels a tile. */
static void run_panels_avx512(const packed_gemm *g, int64_t p0, int64_t p1)
{
    int64_t tiles = (g->m + TILE_ROWS_512 - 1) / TILE_ROWS_512;
    int64_t rows_per_tile = g->m / tiles, longer = g->m % tiles;
    for (int64_t k0 = 0; k0 < g->k; k0 += K_BLOCK) {
        int64_t kc = g->k - k0 < K_BLOCK ? g->k - k0 : K_BLOCK;
        for (int64_t p = p0; p < p1; p += 2) {
            int panels = p1 - p >= 2 ? 2 : 1;
            for (int64_t t = 0; t < tiles; ++t) {
                int64_t i0 = t * rows_per_tile + (t < longer ? t : longer);
                tile_avx512(g, i0, (int)rows_per_tile + (t < longer), p, panels, k0, kc);
            }
        }
    }
}
#endif

/* Panels [p0, p1) over every row of A, K block by K block. */
static void run_panels(const packed_gemm *g, int64_t p0, int64_t p1, int allow_simd)
{
#if defined(__x86_64__)
    if (allow_simd && have_avx512()) {
        run_panels_avx512(g, p0, p1);
        return;
    }
    int simd = allow_simd && have_avx2();
#else
    int simd = 0;
    (void)allow_simd;
#endif
    /* the rows spread evenly over the tiles: a tile of one or two rows takes about as long as
     * a full one (its few accumulators wait on the FMA latency) */
    int64_t tiles = (g->m + TILE_ROWS - 1) / TILE_ROWS;
    int64_t rows_per_tile = g->m / tiles, longer = g->m % tiles;
    for (int64_t k0 = 0; k0 < g->k; k0 += K_BLOCK) {
        int64_t kc = g->k - k0 < K_BLOCK ? g->k - k0 : K_BLOCK;
        for (int64_t p = p0; p < p1; ++p)
            for (int64_t t = 0; t < tiles; ++t) {
                int64_t i0 = t * rows_per_tile + (t < longer ? t : longer);
                int rows = (int)rows_per_tile + (t < longer);
#if defined(__x86_64__)
                if (simd) {
                    tile_avx2(g, i0, rows, p, k0, kc);
                    continue;
                }
#endif
                tile_portable(g, i0, rows, p, k0, kc);
            }
    }
}

static void run_empty_k(const packed_gemm *g)
{
    for (int64_t i = 0; i < g->m; ++i)
        memset(g->y + i * g->n, 0, (size_t)g->n * sizeof(float));
    for (int64_t i0 = 0; i0 < g->m; i0 += TILE_ROWS)
        for (int64_t j0 = 0; j0 < g->n; j0 += PANEL_COLS) {
            int rows = g->m - i0 < TILE_ROWS ? (int)(g->m - i0) : TILE_ROWS;
            int cols = g->n - j0 < PANEL_COLS ? (int)(g->n - j0) : PANEL_COLS;
            finish_tile(g, g->y + i0 * g->n + j0, g->n, i0, j0, rows, cols);
        }
}

void gemm_packed_f32(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                     const float *packed, float beta, const float *c, int64_t c_row_stride,
                     int64_t c_col_stride, float *y, int act, float act_alpha, float act_beta,
                     int allow_simd)
{
    if (m == 0 || n == 0)
        return;
    packed_gemm g = {m, n, k, lda, alpha, beta, a, packed, c, c_row_stride, c_col_stride,
                     y, act, act_alpha, act_beta};
    if (k == 0) {
        run_empty_k(&g);
        return;
    }
    int64_t panels = (n + PANEL_COLS - 1) / PANEL_COLS;
    double useful = (double)m * n * k / MIN_FLOPS_PER_THREAD;
    int threads = kernels_get_num_threads();
    if (useful < threads)
        threads = useful < 1.0 ? 1 : (int)useful;
    if (threads > panels)
        threads = (int)panels;
    if (threads <= 1) {
        run_panels(&g, 0, panels, allow_simd);
        return;
    }
    #pragma omp parallel num_threads(threads)
    {
        int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
        int64_t p0 = panels * t / count, p1 = panels * (t + 1) / count;
        run_panels(&g, p0, p1, allow_simd);
    }
}
