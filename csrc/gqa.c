/* Grouped-query attention (com.microsoft GroupQueryAttention, and the decoder attention that
 * gqa_fusion finds in exported graphs): query head h reads key/value head kv_head_of[h], so
 * K and V are read in place, never repeated.  Per unit of work, two GEMMs (scores = Q K^T,
 * output = P V) with the mask, visible-key window and softmax applied to the score rows in
 * between.  A decode step (one query row) takes every head of a run that shares a KV head in
 * one GEMM, so each K and V row is read once per KV head.  Under an additive causal or padding
 * mask (-inf or finfo.min), a prefill block scores no key its mask drops at the end of every
 * row, and each row's softmax stops at its last kept key, where that is exact. */
#include <math.h>
#include <stdlib.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"
#include "vmath.h"

/* Query rows per unit of work: at most 64, fewer (down to 16) where that leaves fewer than
 * GQA_MIN_UNITS units, two for each of 2 threads (ViT's 3 heads of 37 rows were 3 units, one
 * thread idle half the time). */
enum { GQA_ROWS_PER_BLOCK = 64, GQA_MIN_ROWS_PER_BLOCK = 16, GQA_MIN_UNITS = 4 };

/* Softmax of row[lo..hi) (mask_row added first when given); the rest of the row's first
 * `width` entries become 0.  A row that sees no finite score gets zeros, or NaN with
 * empty_nan (as ONNX Softmax gives over a row of -inf). */
VECTOR_CLONES
static void softmax_window_clones(float *row, int64_t lo, int64_t hi, int64_t width,
                                  const float *mask_row, int64_t mask_col_stride, int empty_nan)
{
    float m = -INFINITY;
    if (mask_row != NULL)
        for (int64_t j = lo; j < hi; ++j) row[j] += mask_row[j * mask_col_stride];
    int has_nan = 0; /* one NaN makes the row NaN; found apart so that both loops vectorise */
    #pragma omp simd reduction(max : m) reduction(| : has_nan)
    for (int64_t j = lo; j < hi; ++j) {
        m = row[j] > m ? row[j] : m;
        has_nan |= row[j] != row[j];
    }
    if (has_nan)
        m = NAN;
    for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
    for (int64_t j = hi > lo ? hi : lo; j < width; ++j) row[j] = 0.0f;
    if (m == -INFINITY || hi <= lo) {
        float fill = empty_nan ? NAN : 0.0f;
        for (int64_t j = lo; j < hi; ++j) row[j] = fill;
        return;
    }
    float total = 0.0f;
    #pragma omp simd reduction(+ : total)
    for (int64_t j = lo; j < hi; ++j) {
        row[j] = vm_exp(row[j] - m);
        total += row[j];
    }
    float inv = 1.0f / total;
    for (int64_t j = lo; j < hi; ++j) row[j] *= inv;
}

#if defined(__x86_64__)
AVX512 static void softmax_window_avx512(float *row, int64_t lo, int64_t hi, int64_t width,
                                         const float *mask_row, int64_t mask_col_stride,
                                         int empty_nan)
{
    if (mask_row != NULL && mask_col_stride == 1)
        for (int64_t j = lo; j < hi; ++j) row[j] += mask_row[j];
    else if (mask_row != NULL)
        for (int64_t j = lo; j < hi; ++j) row[j] += mask_row[j * mask_col_stride];
    size_t n = hi > lo ? (size_t)(hi - lo) : 0;
    float m = vm512_row_max(row + (hi > lo ? lo : 0), n);
    for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
    for (int64_t j = hi > lo ? hi : lo; j < width; ++j) row[j] = 0.0f;
    if (m == -INFINITY || n == 0) {
        float fill = empty_nan ? NAN : 0.0f;
        for (int64_t j = lo; j < hi; ++j) row[j] = fill;
        return;
    }
    float total = vm512_exp_shifted_sum(row + lo, row + lo, n, m);
    vm512_scale(row + lo, n, 1.0f / total);
}
#endif

static void softmax_window(float *row, int64_t lo, int64_t hi, int64_t width,
                           const float *mask_row, int64_t mask_col_stride, int empty_nan)
{
#if defined(__x86_64__)
    if (have_avx512()) {
        softmax_window_avx512(row, lo, hi, width, mask_row, mask_col_stride, empty_nan);
        return;
    }
#endif
    softmax_window_clones(row, lo, hi, width, mask_row, mask_col_stride, empty_nan);
}

/* Keys [lo, hi) that query row i of batch b sees. */
static void visible_keys(int64_t b, int64_t i, int64_t kv_len, const int64_t *kv_valid,
                         const int64_t *q_pos, int causal, int64_t window, int64_t *lo,
                         int64_t *hi)
{
    int64_t end = kv_valid != NULL ? kv_valid[b] : kv_len;
    if (end > kv_len) end = kv_len;
    if (end < 0) end = 0;
    int64_t pos = (q_pos != NULL ? q_pos[b] : 0) + i, start = 0;
    if (causal && pos + 1 < end) end = pos + 1 < 0 ? 0 : pos + 1;
    if (window > 0 && pos - window + 1 > 0) start = pos - window + 1;
    *lo = start < end ? start : end;
    *hi = end;
}

/* What every unit of gqa_f32's work reads.  key_bound is a bound on |scale * q_d * k|, for
 * the largest |q_d|, over every key (infinite where K or V holds a value not finite, or where
 * no unit may drop masked keys). */
typedef struct {
    const float *q, *k, *v, *mask;
    float *y;
    const int64_t *mask_strides, *kv_valid, *q_pos;
    const int32_t *kv_head_of;
    const int *run_first, *run_count;
    int64_t qb_stride, qh_stride, qs_stride, blocks_per_run, block_rows, window;
    int heads, kv_heads, q_len, kv_len, head_size, v_head_size, runs, causal, empty_nan;
    float scale;
    double key_bound;
} gqa_work;

/* A mask value at or below MASK_DROPS drops its key (-inf, or torch's finfo.min); a row whose
 * visible keys include one above MASK_KEEPS has a finite softmax maximum there, far above
 * any dropped key's masked score while every |score| < SCORE_BOUND, so exp gives a dropped
 * key exactly 0 and leaving it out changes no sum. */
#define MASK_DROPS (-1e30)
#define MASK_KEEPS (-1e29)
#define SCORE_BOUND 1e22

/* max |x| over n values, or INFINITY where one is not finite. */
static double max_abs(const float *x, size_t n)
{
    float m = 0.0f;
    int bad = 0;
    #pragma omp simd reduction(max : m) reduction(| : bad)
    for (size_t i = 0; i < n; ++i) {
        float a = fabsf(x[i]);
        m = a > m ? a : m;
        bad |= !(a <= 3.0e38f);
    }
    return bad ? INFINITY : (double)m;
}

/* One past the last key in [lo, hi) that mask_row does not drop (lo where it drops all). */
static int64_t kept_keys_end(const float *mask_row, int64_t col_stride, int64_t lo, int64_t hi)
{
    while (hi > lo && mask_row[(hi - 1) * col_stride] <= MASK_DROPS) --hi;
    return hi;
}

/* The keys a unit of `rows` query rows must score under an additive mask: one past the last
 * key some row keeps, the trailing keys every row's mask drops left out, and *drops set (each
 * row's softmax may leave out its own trailing dropped keys too).  `used` (the bound from
 * kv_valid and causal) and *drops 0 where a row keeps no key, or where scores may be too
 * large for the drop to be exact. */
static int64_t keys_under_mask(const gqa_work *w, int64_t b, int h0, int64_t first, int rows,
                               const float *qa, int lda, int64_t used, int *drops)
{
    *drops = 0;
    if (!(w->key_bound < INFINITY) || w->q_len == 1)
        return used;
    const int64_t *ms = w->mask_strides;
    int64_t kept_end = 0;
    for (int row = 0; row < rows; ++row) {
        int64_t lo, hi, i = first + row, j;
        visible_keys(b, i, w->kv_len, w->kv_valid, w->q_pos, w->causal, w->window, &lo, &hi);
        const float *mask_row = w->mask + b * ms[0] + h0 * ms[1] + i * ms[2];
        for (j = lo; j < hi && !(mask_row[j * ms[3]] > MASK_KEEPS); ++j) {}
        if (j == hi) /* no key to anchor the row's maximum */
            return used;
        int64_t end = kept_keys_end(mask_row, ms[3], lo, hi);
        if (end > kept_end) kept_end = end;
    }
    double q_max = 0.0;
    for (int row = 0; row < rows; ++row) {
        double m = max_abs(qa + (size_t)row * lda, (size_t)w->head_size);
        q_max = m > q_max ? m : q_max;
    }
    if (!(q_max * w->key_bound < SCORE_BOUND))
        return used;
    *drops = 1;
    return kept_end < used ? kept_end : used;
}

/* Unit u: one batch's run of heads (decode) or one block of a head's query rows (prefill),
 * its scores in `scores`. */
static void attend_unit(const gqa_work *w, int64_t u, float *scores)
{
    int64_t b = u / (w->runs * w->blocks_per_run), rest = u % (w->runs * w->blocks_per_run);
    int r = (int)(rest / w->blocks_per_run);
    int64_t first = (rest % w->blocks_per_run) * w->block_rows;
    int h0 = w->run_first[r], kvh = w->kv_head_of[h0], q_len = w->q_len;
    int head_size = w->head_size, v_head_size = w->v_head_size;
    int64_t y_row = (int64_t)w->heads * v_head_size; /* y is (B, S, N, Hv) */
    int rows, lda, ldc;
    const float *qa;
    float *out;
    if (q_len == 1) { /* rows are the run's heads */
        rows = w->run_count[r];
        qa = w->q + b * w->qb_stride + h0 * w->qh_stride;
        lda = (int)w->qh_stride;
        out = w->y + (size_t)b * y_row + (size_t)h0 * v_head_size;
        ldc = v_head_size;
    } else { /* rows are a block of one head's queries */
        rows = (int)(q_len - first < w->block_rows ? q_len - first : w->block_rows);
        qa = w->q + b * w->qb_stride + h0 * w->qh_stride + first * w->qs_stride;
        lda = (int)w->qs_stride;
        out = w->y + ((size_t)b * q_len + first) * y_row + (size_t)h0 * v_head_size;
        ldc = (int)y_row;
    }
    const float *kb = w->k + ((size_t)b * w->kv_heads + kvh) * w->kv_len * head_size;
    const float *vb = w->v + ((size_t)b * w->kv_heads + kvh) * w->kv_len * v_head_size;
    /* keys past the last one any row of the unit sees take no part */
    int64_t used = 0;
    for (int row = 0; row < rows; ++row) {
        int64_t lo, hi, i = q_len == 1 ? 0 : first + row;
        visible_keys(b, i, w->kv_len, w->kv_valid, w->q_pos, w->causal, w->window, &lo, &hi);
        if (hi > used) used = hi;
    }
    int drops = 0;
    if (w->mask != NULL)
        used = keys_under_mask(w, b, h0, first, rows, qa, lda, used, &drops);
    if (used > 0 && head_size > 0)
        gemm_block(0, 1, rows, (int)used, head_size, w->scale, qa, lda > 0 ? lda : 1, kb,
                   head_size, 0.0f, scores, (int)used);
    else
        for (size_t j = 0; j < (size_t)rows * used; ++j) scores[j] = 0.0f;
    for (int row = 0; row < rows; ++row) {
        int64_t h = q_len == 1 ? h0 + row : h0, i = q_len == 1 ? 0 : first + row, lo, hi;
        visible_keys(b, i, w->kv_len, w->kv_valid, w->q_pos, w->causal, w->window, &lo, &hi);
        const float *mask_row = NULL;
        const int64_t *ms = w->mask_strides;
        if (w->mask != NULL)
            mask_row = w->mask + b * ms[0] + h * ms[1] + i * ms[2];
        if (drops) /* the keys the mask drops at the row's end give exactly 0 */
            hi = kept_keys_end(mask_row, ms[3], lo, hi < used ? hi : used);
        softmax_window(scores + (size_t)row * used, lo, hi, used, mask_row,
                       w->mask != NULL ? ms[3] : 0, w->empty_nan);
    }
    if (used > 0 && v_head_size > 0)
        gemm_block(0, 0, rows, v_head_size, (int)used, 1.0f, scores, (int)used, vb,
                   v_head_size, 0.0f, out, ldc);
    else
        for (int row = 0; row < rows; ++row)
            for (int d = 0; d < v_head_size; ++d) out[(size_t)row * ldc + d] = 0.0f;
}

/* Rows per block for q_len query rows in each of `runs` (batch x head) runs: at least
 * GQA_MIN_UNITS units where the rows allow, in blocks of near equal size.  Chosen from the
 * shape alone, never the thread count: a row's sums depend on the block it lies in, and the
 * result must not depend on the threads. */
static int64_t rows_per_block(int64_t q_len, int64_t runs)
{
    int64_t blocks = (q_len + GQA_ROWS_PER_BLOCK - 1) / GQA_ROWS_PER_BLOCK;
    if (q_len <= 1 || runs * blocks >= GQA_MIN_UNITS)
        return GQA_ROWS_PER_BLOCK;
    blocks = (GQA_MIN_UNITS + runs - 1) / runs;
    int64_t rows = (q_len + blocks - 1) / blocks;
    return rows < GQA_MIN_ROWS_PER_BLOCK ? GQA_MIN_ROWS_PER_BLOCK : rows;
}

int gqa_f32(const float *q, const int64_t *q_strides, const float *k, const float *v, float *y,
            int batch, int heads, int kv_heads, int q_len, int kv_len, int head_size,
            int v_head_size, const int32_t *kv_head_of, float scale, const float *mask,
            const int64_t *mask_strides, const int64_t *kv_valid, const int64_t *q_pos,
            int causal, int64_t window, int empty_nan)
{
    /* runs of consecutive query heads that share a KV head: one GEMM per run when decoding */
    int *run_first = malloc(sizeof(int) * (heads > 0 ? heads : 1));
    int *run_count = malloc(sizeof(int) * (heads > 0 ? heads : 1));
    if (run_first == NULL || run_count == NULL) {
        free(run_first);
        free(run_count);
        return -1;
    }
    int runs = 0;
    for (int h = 0; h < heads; ++h) {
        if (q_len == 1 && runs > 0 && kv_head_of[h] == kv_head_of[run_first[runs - 1]]) {
            run_count[runs - 1] += 1;
        } else {
            run_first[runs] = h;
            run_count[runs] = 1;
            runs += 1;
        }
    }
    int64_t block_rows = rows_per_block(q_len, (int64_t)batch * runs);
    int64_t blocks_per_run = (q_len + block_rows - 1) / block_rows;
    int64_t units = (int64_t)batch * runs * blocks_per_run;
    size_t work = (size_t)batch * heads * q_len * kv_len * (size_t)(head_size + v_head_size);
    int threads = threads_for(work / 8);
    if (threads > units) threads = units > 0 ? (int)units : 1;
    int64_t max_rows = q_len == 1 ? heads : block_rows;
    size_t per_thread = (size_t)max_rows * (kv_len > 0 ? kv_len : 1);
    float *scratch = malloc(sizeof(float) * per_thread * threads);
    if (scratch == NULL) {
        free(run_first);
        free(run_count);
        return -1;
    }
    gqa_work w = {q, k, v, mask, y, mask_strides, kv_valid, q_pos, kv_head_of, run_first,
                  run_count, q_strides[0], q_strides[1], q_strides[2], blocks_per_run,
                  block_rows, window,
                  heads, kv_heads, q_len, kv_len, head_size, v_head_size, runs, causal,
                  empty_nan, scale, INFINITY};
    if (mask != NULL && q_len > 1 && kv_len > 0) {
        size_t kn = (size_t)batch * kv_heads * kv_len;
        double k_max = max_abs(k, kn * head_size), v_max = max_abs(v, kn * v_head_size);
        if (k_max < INFINITY && v_max < INFINITY)
            w.key_bound = fabs((double)scale) * head_size * k_max;
    }
    PARALLEL_FOR(threads, for (int64_t u = 0; u < units; ++u)
        attend_unit(&w, u, scratch + per_thread * omp_get_thread_num()););
    free(scratch);
    free(run_first);
    free(run_count);
    return 0;
}
