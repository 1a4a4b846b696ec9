/* The causal-and-padding mask of optimized/passes/gqa_fusion.py's CausalPaddingMask: y (batch,
 * 1, q_len, keys) float32 is 0 where key j <= start + i (query i) and mask[b, j] is not 0, else
 * fill.  start and end are read here, at run time, since they are values of the graph; a run
 * whose values do not give the shape the step was described for fails (the plan then runs the
 * node in Python). */
#include "kernels.h"
#include "internal.h"

static int key_kept(const void *mask, int type, int64_t at)
{
    switch (type) {
    case CAUSAL_MASK_BOOL: return ((const unsigned char *)mask)[at] != 0;
    case CAUSAL_MASK_I32: return ((const int32_t *)mask)[at] != 0;
    case CAUSAL_MASK_I64: return ((const int64_t *)mask)[at] != 0;
    case CAUSAL_MASK_F32: return ((const float *)mask)[at] != 0.0f;
    default: return ((const double *)mask)[at] != 0.0;
    }
}

int causal_padding_mask_f32(const void *mask, int mask_type, const int64_t *start,
                            const int64_t *end, float *y, int64_t batch, int64_t q_len,
                            int64_t keys, float fill)
{
    if (mask_type < CAUSAL_MASK_BOOL || mask_type > CAUSAL_MASK_F64 || batch < 0 || q_len < 0
        || keys < 0 || *end != keys || *start != keys - q_len)
        return -1;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t row = b * keys;
        for (int64_t i = 0; i < q_len; ++i) {
            float *out = y + (b * q_len + i) * keys;
            const int64_t last = *start + i;  /* the last key query i sees */
            for (int64_t j = 0; j < keys; ++j)
                out[j] = j <= last && key_kept(mask, mask_type, row + j) ? 0.0f : fill;
        }
    }
    return 0;
}
