#include <math.h>
#include <stdlib.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"

/* One query row: scores over the keys it may see, softmax, then the weighted sum of values. */
VECTOR_CLONES
static void attend_row(const float *qi, const float *k, const float *v, float *yi, int visible,
                       int head_size, int v_head_size, float scale,
                       const float *mask_row, int64_t mask_col_stride, float *scores)
{
    float m = -INFINITY;
    for (int j = 0; j < visible; ++j) {
        const float *kj = k + (size_t)j * head_size;
        float dot = 0.0f;
        #pragma omp simd reduction(+ : dot)
        for (int d = 0; d < head_size; ++d) dot += qi[d] * kj[d];
        float s = dot * scale;
        if (mask_row != NULL) s += mask_row[j * mask_col_stride];
        scores[j] = s;
        if (s > m || s != s) m = s;
    }
    for (int d = 0; d < v_head_size; ++d) yi[d] = 0.0f;
    if (m == -INFINITY)
        return; /* no key visible: zeros, as the ONNX Attention op defines it */
    float total = 0.0f;
    for (int j = 0; j < visible; ++j) {
        scores[j] = expf(scores[j] - m);
        total += scores[j];
    }
    float inv = 1.0f / total;
    for (int j = 0; j < visible; ++j) {
        const float *vj = v + (size_t)j * v_head_size;
        float p = scores[j] * inv;
        #pragma omp simd
        for (int d = 0; d < v_head_size; ++d) yi[d] += p * vj[d];
    }
}

int attention_f32(const float *q, const float *k, const float *v, float *y, int batch,
                  int heads, int q_len, int kv_len, int head_size, int v_head_size, float scale,
                  const float *mask, const int64_t *mask_strides, int causal, int causal_offset)
{
    int64_t rows = (int64_t)batch * heads * q_len;
    size_t work = (size_t)rows * kv_len * (size_t)(head_size + v_head_size);
    int threads = threads_for(work);
    size_t per_thread = kv_len > 0 ? (size_t)kv_len : 1;
    float *scratch = malloc(sizeof(float) * per_thread * threads);
    if (scratch == NULL)
        return -1;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        int64_t bh = r / q_len, i = r % q_len, b = bh / heads, h = bh % heads;
        int visible = kv_len;
        if (causal) {
            int64_t last = i + causal_offset; /* the last key this query may see */
            visible = last < 0 ? 0 : last + 1 < kv_len ? (int)(last + 1) : kv_len;
        }
        const float *mask_row = NULL;
        int64_t col_stride = 0;
        if (mask != NULL) {
            mask_row = mask + b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2];
            col_stride = mask_strides[3];
        }
        attend_row(q + (size_t)r * head_size, k + (size_t)bh * kv_len * head_size,
                   v + (size_t)bh * kv_len * v_head_size, y + (size_t)r * v_head_size,
                   visible, head_size, v_head_size, scale, mask_row, col_stride,
                   scratch + per_thread * omp_get_thread_num());
    }
    free(scratch);
    return 0;
}
