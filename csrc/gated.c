/* SiLU-gated product of the Llama-style MLP: y = gate * sigmoid(gate) * up, one pass. */
#include "kernels.h"
#include "internal.h"
#include "vmath.h"

VECTOR_CLONES
static void silu_mul_row_clones(const float *gate, const float *up, float *y, size_t cols)
{
    for (size_t j = 0; j < cols; ++j) {
        float g = gate[j];
        y[j] = g * vm_sigmoid(g) * up[j];
    }
}

#if defined(__x86_64__)
AVX512 static void silu_mul_row_avx512(const float *gate, const float *up, float *y,
                                       size_t cols)
{
    for (size_t j = 0; j < cols; j += 16) {
        __mmask16 h = cols - j >= 16 ? 0xffff : vm512_head(cols - j);
        __m512 g = _mm512_maskz_loadu_ps(h, gate + j);
        __m512 silu = _mm512_mul_ps(g, vm512_sigmoid(g));
        _mm512_mask_storeu_ps(y + j, h, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(h, up + j)));
    }
}
#endif

static void silu_mul_row(const float *gate, const float *up, float *y, size_t cols)
{
#if defined(__x86_64__)
    if (have_avx512()) {
        silu_mul_row_avx512(gate, up, y, cols);
        return;
    }
#endif
    silu_mul_row_clones(gate, up, y, cols);
}

void silu_mul_f32(const float *gate, const float *up, float *y, size_t rows, size_t cols,
                  size_t in_stride)
{
    PARALLEL_FOR(threads_for(rows * cols),
        for (size_t r = 0; r < rows; ++r)
            silu_mul_row(gate + r * in_stride, up + r * in_stride, y + r * cols, cols););
}
