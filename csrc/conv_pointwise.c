/* Convolutions as a GEMM with the output step fused, on AVX2: y[m, j] = act(sum_k w[m, k] *
 * b_k[j] + bias[m] + residual[m, j]), where b_k is row k of the GEMM's right-hand side, found
 * through a table of row pointers.  For a 1x1 convolution row k is input channel k's plane;
 * for a strided stem (few input channels) it is one row of a phase of the padded input, so
 * that no im2col matrix is written.
 *
 * Register tile: 6 output channels x 16 output positions (12 accumulators), each weight
 * broadcast from its row, each b_k row loaded two vectors at a time; the bias, the residual and
 * a ReLU are applied in registers before the one store, other activations on the tile's rows
 * while they are in L1.  Accumulation is float32 over k in order, as a GEMM's. */
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"
#include "conv_internal.h"

#if defined(__x86_64__)

enum { TILE_M = 6, TILE_N = 16, PREFETCH_STEPS = 16 };

/* Row i of a tile: s0, s1 (the second used where nv is 2) plus bias, residual, ReLU, stored;
 * the last vector's lanes past `mask` are neither read nor written when masked. */
AVX2 static inline __attribute__((always_inline)) void
finish_row(const int nv, const int masked, __m256 s0, __m256 s1, __m256i mask, const float *bias,
           const float *res, float *y, int relu)
{
    const __m256 zero = _mm256_setzero_ps();
    __m256 s[2] = {s0, s1};
    for (int v = 0; v < nv; ++v) {
        int last = masked && v == nv - 1;
        __m256 r = s[v];
        if (bias != NULL)
            r = _mm256_add_ps(r, _mm256_broadcast_ss(bias));
        if (res != NULL)
            r = _mm256_add_ps(r, last ? _mm256_maskload_ps(res + 8 * v, mask)
                                      : _mm256_loadu_ps(res + 8 * v));
        if (relu) /* max(0, r) is r where r is NaN, as relu_f32 */
            r = _mm256_max_ps(zero, r);
        if (last)
            _mm256_maskstore_ps(y + 8 * v, mask, r);
        else
            _mm256_storeu_ps(y + 8 * v, r);
    }
}

/* Sums so far of output row i of a tile, as stored by an earlier slice of k. */
#define TILE_LOAD(i)                                                                       \
    if (mr > i) {                                                                          \
        const float *yi = y + i * ldy;                                                     \
        if (nv == 1) {                                                                     \
            c##i##0 = masked ? _mm256_maskload_ps(yi, mask) : _mm256_loadu_ps(yi);         \
        } else {                                                                           \
            c##i##0 = _mm256_loadu_ps(yi);                                                 \
            c##i##1 = masked ? _mm256_maskload_ps(yi + 8, mask) : _mm256_loadu_ps(yi + 8); \
        }                                                                                  \
    }

/* One tile of mr x (8 * nv) outputs: panel holds the tile's b values, 16 a step of k (see
 * pack_panels).  The sums start at 0 for the first slice of k, else from y.  The accumulators
 * are named variables, not an array: GCC keeps an array of vectors in memory, storing it on
 * every step of k.  next_w: NULL, or the weights of the next tile's next_mr rows (ldw apart),
 * fetched into L1 a cache line per row every 16 steps of k (see gemm_rows). */
AVX2 static inline __attribute__((always_inline)) void
tile(const int mr, const int nv, const int masked, int64_t depth, const float *w, int64_t ldw,
     const float *panel, __m256i mask, const float *bias, const float *res, float *y,
     int64_t ldy, int relu, int first, const float *next_w, int next_mr)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    if (!first) {
        TILE_LOAD(0) TILE_LOAD(1) TILE_LOAD(2) TILE_LOAD(3) TILE_LOAD(4) TILE_LOAD(5)
    }
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw, *w4 = w + 4 * ldw,
                *w5 = w + 5 * ldw;
    for (int64_t k0 = 0; k0 < depth; k0 += PREFETCH_STEPS) {
        int64_t k1 = k0 + PREFETCH_STEPS < depth ? k0 + PREFETCH_STEPS : depth;
        if (next_w != NULL)
            for (int i = 0; i < next_mr; ++i)
                _mm_prefetch((const char *)(next_w + i * ldw + k0), _MM_HINT_T0);
        for (int64_t k = k0; k < k1; ++k) {
            const float *b = panel + k * TILE_N;
            __m256 b0 = _mm256_load_ps(b), b1 = nv == 2 ? _mm256_load_ps(b + 8) : b0;
#define TILE_STEP(i)                                                                       \
            if (mr > i) {                                                                  \
                __m256 a = _mm256_broadcast_ss(w##i + k);                                  \
                c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);                                 \
                if (nv == 2)                                                               \
                    c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);                             \
            }
            TILE_STEP(0) TILE_STEP(1) TILE_STEP(2) TILE_STEP(3) TILE_STEP(4) TILE_STEP(5)
#undef TILE_STEP
        }
    }
#define TILE_FINISH(i)                                                                     \
    if (mr > i)                                                                            \
        finish_row(nv, masked, c##i##0, c##i##1, mask, bias != NULL ? bias + i : NULL,     \
                   res != NULL ? res + i * ldy : NULL, y + i * ldy, relu);
    TILE_FINISH(0) TILE_FINISH(1) TILE_FINISH(2) TILE_FINISH(3) TILE_FINISH(4) TILE_FINISH(5)
#undef TILE_FINISH
}

/* Packed panels: panel t of a block starts PANEL_PAD floats past the end of panel t - 1, so
 * that a row of b stored across the panels (pack_by_row) does not land every store in one L1
 * set: without it a depth of 128 puts the panels 8 KiB apart, and packing 128->16 on 55x55 by
 * rows took 15% longer than by panels with its input in L3. */
enum { PANEL_PAD = 16, ROW_ORDER_DEPTH = 96 };

static inline int64_t panel_stride(int64_t depth)
{
    return depth * TILE_N + PANEL_PAD;
}

/* Columns [col0, col1) of the b rows copied into 32-byte aligned panels of TILE_N columns:
 * panel t holds b_k[col0 + 16 t + j] at [t * panel_stride(depth) + k * 16 + j], zeros past
 * col1.  By panels: for each panel, 64 bytes of every row. */
AVX2 static void pack_by_panel(const float *const *rows, int64_t depth, int64_t col0,
                               int64_t col1, float *panels)
{
    for (int64_t col = col0; col < col1; col += TILE_N) {
        int64_t n = col1 - col < TILE_N ? col1 - col : TILE_N;
        float *p = panels + (col - col0) / TILE_N * panel_stride(depth);
        if (n == TILE_N) {
            for (int64_t k = 0; k < depth; ++k) {
                const float *b = rows[k] + col;
                _mm256_store_ps(p + k * TILE_N, _mm256_loadu_ps(b));
                _mm256_store_ps(p + k * TILE_N + 8, _mm256_loadu_ps(b + 8));
            }
        } else {
            for (int64_t k = 0; k < depth; ++k) {
                const float *b = rows[k] + col;
                for (int64_t j = 0; j < TILE_N; ++j)
                    p[k * TILE_N + j] = j < n ? b[j] : 0.0f;
            }
        }
    }
}

/* The same panels, by rows: each row's columns read in one sequential run. */
AVX2 static void pack_by_row(const float *const *rows, int64_t depth, int64_t col0, int64_t col1,
                             float *panels)
{
    int64_t full = col0 + (col1 - col0) / TILE_N * TILE_N, stride = panel_stride(depth);
    for (int64_t k = 0; k < depth; ++k) {
        const float *b = rows[k];
        float *p = panels + k * TILE_N;
        for (int64_t col = col0; col < full; col += TILE_N, p += stride) {
            _mm256_store_ps(p, _mm256_loadu_ps(b + col));
            _mm256_store_ps(p + 8, _mm256_loadu_ps(b + col + 8));
        }
        if (full < col1)
            for (int64_t j = 0; j < TILE_N; ++j)
                p[j] = full + j < col1 ? b[full + j] : 0.0f;
    }
}

/* Deep slices are packed by rows: by panels, each panel takes 64 bytes from each of `depth`
 * rows a plane apart, a pattern the hardware prefetchers do not follow, so an input that
 * comes from memory (the previous layer's output, evicted) is read at memory latency.  One
 * process, calls alternated with the old packing, each after a 48 MiB write, 1 thread, median
 * ratio of 300 pairs at load 7: 128->16 on 55x55 0.81, 128->32 on 27x27 0.91, 256->32 on
 * 27x27 0.91, 576->128 on 14x14 0.96; with the input in cache 1.00-1.03 (the same as two
 * copies of the old code, 1.01-1.03).  Shallow ones (16 to 64 deep) showed no gain. */
AVX2 static void pack_panels(const float *const *rows, int64_t depth, int64_t col0, int64_t col1,
                             float *panels)
{
    if (depth >= ROW_ORDER_DEPTH)
        pack_by_row(rows, depth, col0, col1, panels);
    else
        pack_by_panel(rows, depth, col0, col1, panels);
}

/* The tiles of mr output channels over columns [col0, col1), from their packed panels; the
 * first one prefetches the next tile row's weights (next_w, next_mr as tile's). */
AVX2 static inline __attribute__((always_inline)) void
tile_row(const int mr, int64_t depth, const float *w, int64_t ldw, const float *panels,
         int64_t col0, int64_t col1, const float *bias, const float *res, float *y, int64_t ldy,
         int relu, int first, const float *next_w, int next_mr)
{
    int64_t col = col0;
    __m256i ones = _mm256_set1_epi32(-1);
    const float *res_at = NULL;
    for (; col + TILE_N <= col1; col += TILE_N) {
        res_at = res != NULL ? res + col : NULL;
        tile(mr, 2, 0, depth, w, ldw, panels + (col - col0) / TILE_N * panel_stride(depth), ones,
             bias, res_at, y + col, ldy, relu, first, col == col0 ? next_w : NULL, next_mr);
    }
    int64_t left = col1 - col;
    if (left == 0)
        return;
    res_at = res != NULL ? res + col : NULL;
    int64_t in_last = left > 8 ? left - 8 : left;
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)in_last),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const float *p = panels + (col - col0) / TILE_N * panel_stride(depth);
    const float *pf = col == col0 ? next_w : NULL;
    if (left > 8)
        tile(mr, 2, 1, depth, w, ldw, p, mask, bias, res_at, y + col, ldy, relu, first, pf,
             next_mr);
    else
        tile(mr, 1, 1, depth, w, ldw, p, mask, bias, res_at, y + col, ldy, relu, first, pf,
             next_mr);
}

enum { DEPTH_SLICE = 256, DOT_TAIL = 2 };

/* Output rows [0, mr) at `tail` (at most DOT_TAIL) columns as dot products over k, vectors
 * along k: y[i, c] (+)= w_i[0..kd) . xcol[c * kd + 0..kd).  A block whose width leaves one or
 * two columns past its last 16-column tile (7x7 planes: 49 = 3 x 16 + 1) would otherwise spend
 * a tile, nearly as slow as a full one, on them.  Bias, residual and ReLU as a tile's. */
AVX2 static void dot_tail(int64_t mr, int64_t kd, const float *w, int64_t ldw, const float *xcol,
                          int tail, const float *bias, const float *res, float *y, int64_t ldy,
                          int relu, int first)
{
    for (int64_t i = 0; i < mr; ++i) {
        const float *wi = w + i * ldw;
        for (int c = 0; c < tail; ++c) {
            const float *xc = xcol + c * kd;
            __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            int64_t k = 0;
            for (; k + 32 <= kd; k += 32) {
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(wi + k), _mm256_loadu_ps(xc + k), s0);
                s1 = _mm256_fmadd_ps(_mm256_loadu_ps(wi + k + 8), _mm256_loadu_ps(xc + k + 8), s1);
                s2 = _mm256_fmadd_ps(_mm256_loadu_ps(wi + k + 16), _mm256_loadu_ps(xc + k + 16), s2);
                s3 = _mm256_fmadd_ps(_mm256_loadu_ps(wi + k + 24), _mm256_loadu_ps(xc + k + 24), s3);
            }
            for (; k + 8 <= kd; k += 8)
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(wi + k), _mm256_loadu_ps(xc + k), s0);
            float v = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
            for (; k < kd; ++k)
                v += wi[k] * xc[k];
            float *yi = y + i * ldy + c;
            if (!first)
                v += *yi;
            if (bias != NULL)
                v += bias[i];
            if (res != NULL)
                v += res[i * ldy + c];
            if (relu) /* NaN stays NaN, as relu_f32 */
                v = v < 0.0f ? 0.0f : v;
            *yi = v;
        }
    }
}

/* Output channels [m0, m1) over columns [col0, col1): weight row m at w + m * ldw, output row
 * m at y + m * ldy (residual alike), bias[m]; b row k at rows[k].  Depth goes in slices of
 * DEPTH_SLICE, so that a slice's panels stay in L2 and its weight rows in L1; the output step
 * comes with the last.  panels: scratch for the panels (panel_stride) of min(depth, DEPTH_SLICE)
 * rows over (col1 - col0) columns rounded up to 16, 32-byte aligned. */
AVX2 static void gemm_rows(int64_t m0, int64_t m1, int64_t depth, const float *w, int64_t ldw,
                           const float *const *rows, int64_t col0, int64_t col1,
                           const float *bias, const float *res, float *y, int64_t ldy,
                           const struct conv_output *o, float *panels)
{
    int relu = o->act == ACT_RELU;
    int tail = (int)((col1 - col0) % TILE_N);
    tail = tail <= DOT_TAIL ? tail : 0;
    int64_t tiled = col1 - tail; /* columns [col0, tiled) in tiles, the rest in dot_tail */
    float xcol[DOT_TAIL * DEPTH_SLICE] __attribute__((aligned(32)));
    for (int64_t k0 = 0; k0 < depth; k0 += DEPTH_SLICE) {
        int64_t kd = depth - k0 < DEPTH_SLICE ? depth - k0 : DEPTH_SLICE;
        int first = k0 == 0, last = k0 + kd == depth;
        const float *bs = last ? bias : NULL, *rs = last ? res : NULL;
        int rl = last && relu;
        pack_panels(rows + k0, kd, col0, tiled, panels);
        for (int c = 0; c < tail; ++c)
            for (int64_t k = 0; k < kd; ++k)
                xcol[c * kd + k] = rows[k0 + k][tiled + c];
        for (int64_t m = m0; m < m1; m += TILE_M) {
            int64_t mr = m1 - m < TILE_M ? m1 - m : TILE_M;
            const float *wm = w + m * ldw + k0, *bm = bs != NULL ? bs + m : NULL;
            const float *rm = rs != NULL ? rs + m * ldy : NULL;
            float *ym = y + m * ldy;
            int64_t next = m + TILE_M;
            const float *nw = next < m1 ? wm + TILE_M * ldw : NULL;
            int nmr = (int)(m1 - next < TILE_M ? m1 - next : TILE_M);
            switch (mr) {
            case 6: tile_row(6, kd, wm, ldw, panels, col0, tiled, bm, rm, ym, ldy, rl, first, nw, nmr); break;
            case 5: tile_row(5, kd, wm, ldw, panels, col0, tiled, bm, rm, ym, ldy, rl, first, nw, nmr); break;
            case 4: tile_row(4, kd, wm, ldw, panels, col0, tiled, bm, rm, ym, ldy, rl, first, nw, nmr); break;
            case 3: tile_row(3, kd, wm, ldw, panels, col0, tiled, bm, rm, ym, ldy, rl, first, nw, nmr); break;
            case 2: tile_row(2, kd, wm, ldw, panels, col0, tiled, bm, rm, ym, ldy, rl, first, nw, nmr); break;
            default: tile_row(1, kd, wm, ldw, panels, col0, tiled, bm, rm, ym, ldy, rl, first, nw, nmr); break;
            }
            if (tail > 0)
                dot_tail(mr, kd, wm, ldw, xcol, tail, bm, rm != NULL ? rm + tiled : NULL,
                         ym + tiled, ldy, rl, first);
            if (last && o->act != ACT_NONE && !relu)
                for (int64_t i = 0; i < mr; ++i)
                    activate_inplace(ym + i * ldy + col0, (size_t)(col1 - col0), o->act,
                                     o->alpha, o->beta);
        }
    }
}

/* Per-thread scratch: the b row pointers and the packed panels. */
struct scratch {
    const float **rows;
    float *panels;
    size_t panel_floats;
};

static int scratch_open(struct scratch *s, int64_t depth, int64_t columns, int threads)
{
    int64_t slice = depth < DEPTH_SLICE ? depth : DEPTH_SLICE;
    s->panel_floats = (size_t)panel_stride(slice) * (size_t)((columns + TILE_N - 1) / TILE_N);
    s->rows = malloc(sizeof(*s->rows) * (size_t)depth * threads);
    s->panels = aligned_alloc(64, sizeof(float) * s->panel_floats * threads);
    if (s->rows == NULL || s->panels == NULL) {
        free(s->rows), free(s->panels);
        return -1;
    }
    return 0;
}

static void scratch_close(struct scratch *s)
{
    free(s->rows), free(s->panels);
}

/* Columns per block: a depth slice of the block's b rows (at most 128 KiB) stays in L2, and
 * one tile row of outputs in L1 for the activation pass; the blocks of a plane as even as
 * whole tiles allow. */
static int64_t block_columns(int64_t depth, int64_t plane)
{
    int64_t slice = depth < DEPTH_SLICE ? depth : DEPTH_SLICE;
    int64_t cols = (32 * 1024 / slice) / TILE_N * TILE_N;
    if (cols < TILE_N)
        cols = TILE_N;
    if (cols > 512)
        cols = 512;
    if (cols >= plane)
        return plane;
    int64_t blocks = (plane + cols - 1) / cols;
    return ((plane + blocks - 1) / blocks + TILE_N - 1) / TILE_N * TILE_N;
}

/* Runs tasks [0, tasks) of body(t, thread) on `threads` OpenMP threads, or on the calling
 * thread when one. */
#define FOR_TASKS(threads, tasks, ...)                                                     \
    do {                                                                                   \
        int for_tasks_threads_ = (threads);                                                \
        if (for_tasks_threads_ > 1) {                                                      \
            _Pragma("omp parallel for num_threads(for_tasks_threads_) schedule(dynamic)")  \
            for (int64_t t = 0; t < (tasks); ++t) {                                        \
                int thread = omp_get_thread_num();                                         \
                __VA_ARGS__                                                                \
            }                                                                              \
        } else {                                                                           \
            for (int64_t t = 0; t < (tasks); ++t) {                                        \
                int thread = 0;                                                            \
                __VA_ARGS__                                                                \
            }                                                                              \
        }                                                                                  \
    } while (0)

/* Output-channel chunks per (image, group, column block), each a whole number of tiles.  Every
 * chunk packs its columns' panels again, so there are few: one where the blocks alone give
 * each thread several tasks, else the fewest that split the tasks evenly across the threads
 * (four per thread packed each 7x7 or 14x14 plane eight times, and mobilenet_v3_small's 1x1
 * convolutions ran no faster on two threads than on one).  A last block under 7/8 of the
 * others leaves the units uneven whatever their count (resnet50's 14x14 planes of depth 256
 * to 1024 ran as blocks of 112 and 84 columns, one per thread), so each block is cut in
 * `threads` chunks where a chunk has 96 channels or more: its panels packed once more cost
 * 5% of 128 channels' multiply-adds (1024->128 on 14x14 took 610 us at 1 thread, 1024->256
 * 1163), less than the 14% the longer block cost. */
static int64_t channel_chunks(int64_t units, int64_t columns, int64_t last_columns,
                              int64_t out_per_group, int threads)
{
    if (threads <= 1 || units >= 4 * threads)
        return 1;
    int uneven = 8 * last_columns < 7 * columns && out_per_group >= 96 * threads;
    int64_t common = uneven ? 1 : units, rest = threads;
    while (rest != 0) {
        int64_t r = common % rest;
        common = rest, rest = r;
    }
    int64_t tiles = (out_per_group + TILE_M - 1) / TILE_M, chunks = threads / common;
    return chunks < tiles ? chunks : tiles;
}

int conv_pointwise_avx2(const float *x, int64_t batch, int64_t in_c, int64_t group,
                        const float *w, int64_t out_c, size_t plane, float *y,
                        const struct conv_output *o)
{
    int64_t depth = in_c / group, out_per_group = out_c / group;
    int64_t columns = block_columns(depth, (int64_t)plane);
    int64_t blocks = ((int64_t)plane + columns - 1) / columns;
    int64_t units = batch * group * blocks;
    /* a multiply-add here takes about a third of threads_for's unit (0.034 ns against 0.08 to
     * 0.12 for an elementwise element or a depthwise tap), so a thread gets 4 us or more of
     * work, several times the 1 us a parallel region of two threads costs */
    int threads = threads_for((size_t)batch * out_c * plane * (size_t)depth / 8);
    int64_t chunks = channel_chunks(units, columns, (int64_t)plane - (blocks - 1) * columns,
                                    out_per_group, threads);
    int64_t per_chunk = ((out_per_group + chunks - 1) / chunks + TILE_M - 1) / TILE_M * TILE_M;
    int64_t tasks = units * chunks;
    if (threads > tasks)
        threads = (int)tasks;
    struct scratch s;
    if (scratch_open(&s, depth, columns, threads) != 0)
        return -1;
    FOR_TASKS(threads, tasks, {
        int64_t chunk = t % chunks, unit = t / chunks;
        int64_t blk = unit % blocks, gi = (unit / blocks) % group, image = unit / (blocks * group);
        int64_t m0 = chunk * per_chunk, m1 = m0 + per_chunk < out_per_group ? m0 + per_chunk : out_per_group;
        if (m0 < m1) {
            const float **r = s.rows + (size_t)depth * thread;
            const float *xg = x + ((size_t)image * in_c + (size_t)gi * depth) * plane;
            for (int64_t k = 0; k < depth; ++k)
                r[k] = xg + (size_t)k * plane;
            size_t y_offset = ((size_t)image * out_c + (size_t)gi * out_per_group) * plane;
            int64_t col0 = blk * columns, col1 = col0 + columns < (int64_t)plane ? col0 + columns : (int64_t)plane;
            gemm_rows(m0, m1, depth, w + (size_t)gi * out_per_group * depth, depth, r, col0, col1,
                      o->bias != NULL ? o->bias + gi * out_per_group : NULL,
                      o->residual != NULL ? o->residual + y_offset : NULL, y + y_offset,
                      (int64_t)plane, o, s.panels + s.panel_floats * thread);
        }
    });
    scratch_close(&s);
    return 0;
}

/* Direct convolution for few input channels (a stem): the padded input is laid out once per
 * image as stride_w phases per row (phase q of a padded row holds its columns q, q + sw, ...),
 * so tap (c, ky, kx) of output row oy is a contiguous run of phase (kx * dw) % sw of padded row
 * oy * sh + ky * dh, starting (kx * dw) / sw in.  Each output row is then one GEMM with depth
 * in_c * k_h * k_w over those runs, with no im2col. */
struct phases {
    int64_t rows, width, stride; /* padded rows; floats per phase of a row; phases per row */
};

static struct phases phases_of(const struct conv_geometry *g)
{
    int64_t hp = (g->out_h - 1) * g->stride_h + (g->k_h - 1) * g->dil_h + 1;
    int64_t wp = (g->out_w - 1) * g->stride_w + (g->k_w - 1) * g->dil_w + 1;
    struct phases p = {hp, (wp + g->stride_w - 1) / g->stride_w, g->stride_w};
    return p;
}

/* Phase q of one padded row: d[j] = src[j * sw + q - pad_left], 0 outside the input row. */
static void phase_row(const float *src, int64_t in_w, int64_t pad_left, int64_t sw, int64_t q,
                      int64_t width, float *d)
{
    int64_t lo, hi; /* j with the source column inside the row */
    inside_range(q - pad_left, sw, in_w, width, &lo, &hi);
    for (int64_t j = 0; j < lo; ++j)
        d[j] = 0.0f;
    const float *s = src + q - pad_left;
    if (sw == 1)
        memcpy(d + lo, s + lo, sizeof(float) * (size_t)(hi - lo));
    else
        for (int64_t j = lo; j < hi; ++j)
            d[j] = s[j * sw];
    for (int64_t j = hi; j < width; ++j)
        d[j] = 0.0f;
}

/* d[j] of phase q for j in [j0, j1), one at a time (the ends of a row). */
static void phase_span(const float *src, int64_t in_w, int64_t pad_left, int64_t sw, int64_t q,
                       int64_t j0, int64_t j1, float *d)
{
    for (int64_t j = j0; j < j1; ++j) {
        int64_t ix = j * sw + q - pad_left;
        d[j] = ix >= 0 && ix < in_w ? src[ix] : 0.0f;
    }
}

/* Both phases of a stride-2 row: where 16 consecutive source columns lie inside the row, they
 * split into 8 even and 8 odd at once. */
AVX2 static void two_phase_row(const float *src, int64_t in_w, int64_t pad_left, int64_t width,
                               float *even, float *odd)
{
    int64_t j0 = (pad_left + 1) / 2, j = j0; /* the first j whose column 2j - pad_left >= 0 */
    for (; j + 8 <= width && 2 * j - pad_left + 16 <= in_w; j += 8) {
        const float *s = src + 2 * j - pad_left;
        __m256 a = _mm256_loadu_ps(s), b = _mm256_loadu_ps(s + 8);
        __m256 ev = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        __m256 od = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        _mm256_storeu_ps(even + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xd8)));
        _mm256_storeu_ps(odd + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xd8)));
    }
    int64_t j_start = j0 < width ? j0 : width;
    phase_span(src, in_w, pad_left, 2, 0, 0, j_start, even);
    phase_span(src, in_w, pad_left, 2, 1, 0, j_start, odd);
    phase_span(src, in_w, pad_left, 2, 0, j > j_start ? j : j_start, width, even);
    phase_span(src, in_w, pad_left, 2, 1, j > j_start ? j : j_start, width, odd);
}

static void lay_out_phases(const float *x, const struct conv_geometry *g, struct phases p,
                           float *ph)
{
    for (int64_t c = 0; c < g->channels; ++c)
        for (int64_t py = 0; py < p.rows; ++py) {
            float *dst = ph + ((size_t)c * p.rows + py) * p.stride * p.width;
            int64_t iy = py - g->pad_top;
            if (iy < 0 || iy >= g->in_h) {
                memset(dst, 0, sizeof(float) * (size_t)(p.stride * p.width));
                continue;
            }
            const float *src = x + ((size_t)c * g->in_h + iy) * g->in_w;
            if (p.stride == 2) {
                two_phase_row(src, g->in_w, g->pad_left, p.width, dst, dst + p.width);
                continue;
            }
            for (int64_t q = 0; q < p.stride; ++q)
                phase_row(src, g->in_w, g->pad_left, p.stride, q, p.width, dst + q * p.width);
        }
}

/* Whether the phase layout stays near the input's size (a stride far past the input would
 * make it mostly padding). */
int stem_fits(const struct conv_geometry *g)
{
    struct phases p = phases_of(g);
    double floats = (double)p.rows * p.stride * p.width;
    return floats <= 4.0 * (double)(g->in_h + 2) * (g->in_w + 2) + 4096.0;
}

enum { STEM_ROWS_PER_TASK = 2 };

int conv_stem_avx2(const float *x, const struct conv_geometry *g, int64_t batch,
                   const float *w, int64_t out_c, float *y, const struct conv_output *o)
{
    struct phases p = phases_of(g);
    int64_t taps = g->k_h * g->k_w, depth = g->channels * taps;
    int64_t columns = block_columns(depth, g->out_w);
    size_t plane = (size_t)g->out_h * g->out_w, in_plane = (size_t)g->in_h * g->in_w;
    size_t per_image = (size_t)g->channels * p.rows * p.stride * p.width;
    int64_t bands = (g->out_h + STEM_ROWS_PER_TASK - 1) / STEM_ROWS_PER_TASK;
    int64_t tasks = batch * bands;
    int threads = threads_for((size_t)batch * out_c * plane * (size_t)depth / 64);
    if (threads > tasks)
        threads = (int)tasks;
    float *ph = malloc(sizeof(float) * per_image * (size_t)batch);
    struct scratch s;
    if (ph == NULL || scratch_open(&s, depth, columns, threads) != 0) {
        free(ph);
        return -1;
    }
    size_t *offsets = malloc(sizeof(size_t) * (size_t)depth);
    if (offsets == NULL) {
        free(ph);
        scratch_close(&s);
        return -1;
    }
    /* tap k of output row 0, from the image's phase layout; row oy is oy * sh padded rows on */
    for (int64_t k = 0; k < depth; ++k) {
        int64_t c = k / taps, ky = (k / g->k_w) % g->k_h, kx = k % g->k_w, dx = kx * g->dil_w;
        offsets[k] = (((size_t)c * p.rows + ky * g->dil_h) * p.stride + dx % p.stride) * p.width
                     + dx / p.stride;
    }
    /* one image is one loop step: a team would only wait for a thread with nothing to do */
    PARALLEL_FOR(batch > 1 ? threads_for(per_image * (size_t)batch) : 1,
        for (int64_t b = 0; b < batch; ++b)
            lay_out_phases(x + (size_t)b * g->channels * in_plane, g, p, ph + per_image * b););
    FOR_TASKS(threads, tasks, {
        int64_t image = t / bands, band = t % bands;
        const float **r = s.rows + (size_t)depth * thread;
        const float *pi = ph + per_image * image;
        size_t y_offset = (size_t)image * out_c * plane;
        int64_t oy1 = (band + 1) * STEM_ROWS_PER_TASK;
        for (int64_t oy = band * STEM_ROWS_PER_TASK; oy < oy1 && oy < g->out_h; ++oy) {
            const float *row_base = pi + (size_t)oy * g->stride_h * p.stride * p.width;
            for (int64_t k = 0; k < depth; ++k)
                r[k] = row_base + offsets[k];
            size_t row = y_offset + (size_t)oy * g->out_w;
            for (int64_t col0 = 0; col0 < g->out_w; col0 += columns) {
                int64_t col1 = col0 + columns < g->out_w ? col0 + columns : g->out_w;
                gemm_rows(0, out_c, depth, w, depth, r, col0, col1, o->bias,
                          o->residual != NULL ? o->residual + row : NULL, y + row,
                          (int64_t)plane, o, s.panels + s.panel_floats * thread);
            }
        }
    });
    free(ph), free(offsets);
    scratch_close(&s);
    return 0;
}

int conv_avx2_available(void)
{
    return have_avx2();
}

#else

int conv_pointwise_avx2(const float *x, int64_t batch, int64_t in_c, int64_t group,
                        const float *w, int64_t out_c, size_t plane, float *y,
                        const struct conv_output *o)
{
    (void)x, (void)batch, (void)in_c, (void)group, (void)w, (void)out_c, (void)plane, (void)y,
        (void)o;
    return -1;
}

int conv_stem_avx2(const float *x, const struct conv_geometry *g, int64_t batch,
                   const float *w, int64_t out_c, float *y, const struct conv_output *o)
{
    (void)x, (void)g, (void)batch, (void)w, (void)out_c, (void)y, (void)o;
    return -1;
}

int stem_fits(const struct conv_geometry *g)
{
    (void)g;
    return 0;
}

int conv_avx2_available(void)
{
    return 0;
}

#endif
