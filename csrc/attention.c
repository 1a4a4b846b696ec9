/* Attention as two GEMMs per block of query rows (scores = Q K^T, output = P V) with the
 * scale, mask, causal cut and softmax applied to the score block in between, so the BLAS does
 * the flops and the scores of a block stay in cache. */
#include <math.h>
#include <stdlib.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"
#include "vmath.h"

enum { ROWS_PER_BLOCK = 64 };

/* Softmax of one score row over its first `visible` keys; later keys get probability 0.  A
 * row that sees no key (all -inf) becomes zeros, as the ONNX Attention op defines it. */
VECTOR_CLONES
static void softmax_visible_clones(float *row, int visible, int kv_len, const float *mask_row,
                                   int64_t mask_col_stride)
{
    float m = -INFINITY;
    for (int j = 0; j < visible; ++j) {
        if (mask_row != NULL) row[j] += mask_row[j * mask_col_stride];
        if (row[j] > m || row[j] != row[j]) m = row[j];
    }
    if (m == -INFINITY)
        visible = 0;
    float total = 0.0f;
    for (int j = 0; j < visible; ++j)
        row[j] = vm_exp(row[j] - m);
    #pragma omp simd reduction(+ : total)
    for (int j = 0; j < visible; ++j)
        total += row[j];
    float inv = 1.0f / total;
    for (int j = 0; j < visible; ++j) row[j] *= inv;
    for (int j = visible; j < kv_len; ++j) row[j] = 0.0f;
}

#if defined(__x86_64__)
AVX512 static void softmax_visible_avx512(float *row, int visible, int kv_len,
                                          const float *mask_row, int64_t mask_col_stride)
{
    if (mask_row != NULL && mask_col_stride == 1)
        for (int j = 0; j < visible; ++j) row[j] += mask_row[j];
    else if (mask_row != NULL)
        for (int j = 0; j < visible; ++j) row[j] += mask_row[j * mask_col_stride];
    float m = vm512_row_max(row, (size_t)visible);
    if (m == -INFINITY)
        visible = 0;
    float total = vm512_exp_shifted_sum(row, row, (size_t)visible, m);
    vm512_scale(row, (size_t)visible, 1.0f / total);
    for (int j = visible; j < kv_len; ++j) row[j] = 0.0f;
}
#endif

static void softmax_visible(float *row, int visible, int kv_len, const float *mask_row,
                            int64_t mask_col_stride)
{
#if defined(__x86_64__)
    if (have_avx512()) {
        softmax_visible_avx512(row, visible, kv_len, mask_row, mask_col_stride);
        return;
    }
#endif
    softmax_visible_clones(row, visible, kv_len, mask_row, mask_col_stride);
}

int attention_f32(const float *q, const float *k, const float *v, float *y, int batch,
                  int heads, int q_len, int kv_len, int head_size, int v_head_size, float scale,
                  const float *mask, const int64_t *mask_strides, int causal, int causal_offset)
{
    int64_t blocks_per_head = (q_len + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    int64_t blocks = (int64_t)batch * heads * blocks_per_head;
    size_t work = (size_t)batch * heads * q_len * kv_len * (size_t)(head_size + v_head_size);
    int threads = threads_for(work / 8);
    if (threads > blocks) threads = blocks > 0 ? (int)blocks : 1;
    size_t per_thread = (size_t)ROWS_PER_BLOCK * (kv_len > 0 ? kv_len : 1);
    float *scratch = malloc(sizeof(float) * per_thread * threads);
    if (scratch == NULL)
        return -1;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        int64_t bh = blk / blocks_per_head, b = bh / heads, h = bh % heads;
        int first = (int)(blk % blocks_per_head) * ROWS_PER_BLOCK;
        int rows = q_len - first < ROWS_PER_BLOCK ? q_len - first : ROWS_PER_BLOCK;
        const float *qb = q + ((size_t)bh * q_len + first) * head_size;
        const float *kb = k + (size_t)bh * kv_len * head_size;
        const float *vb = v + (size_t)bh * kv_len * v_head_size;
        float *yb = y + ((size_t)bh * q_len + first) * v_head_size;
        float *scores = scratch + per_thread * omp_get_thread_num();
        if (kv_len > 0 && head_size > 0)
            gemm_block(0, 1, rows, kv_len, head_size, scale, qb, head_size, kb, head_size, 0.0f,
                       scores, kv_len);
        else
            for (size_t j = 0; j < (size_t)rows * kv_len; ++j) scores[j] = 0.0f;
        for (int r = 0; r < rows; ++r) {
            int i = first + r, visible = kv_len;
            if (causal) {
                int64_t last = (int64_t)i + causal_offset; /* the last key query i may see */
                visible = last < 0 ? 0 : last + 1 < kv_len ? (int)(last + 1) : kv_len;
            }
            const float *mask_row = NULL;
            if (mask != NULL)
                mask_row = mask + b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2];
            softmax_visible(scores + (size_t)r * kv_len, visible, kv_len, mask_row,
                            mask != NULL ? mask_strides[3] : 0);
        }
        if (kv_len > 0)
            gemm_block(0, 0, rows, v_head_size, kv_len, 1.0f, scores, kv_len, vb, v_head_size,
                       0.0f, yb, v_head_size);
        else
            for (size_t j = 0; j < (size_t)rows * v_head_size; ++j) yb[j] = 0.0f;
    }
    free(scratch);
    return 0;
}
