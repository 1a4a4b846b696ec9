/* SiLU-gated product of the Llama-style MLP: y = gate * sigmoid(gate) * up, one pass. */
#include "kernels.h"
#include "internal.h"
#include "vmath.h"

VECTOR_CLONES
static void silu_mul_row(const float *gate, const float *up, float *y, size_t cols)
{
    for (size_t j = 0; j < cols; ++j) {
        float g = gate[j];
        y[j] = g * vm_sigmoid(g) * up[j];
    }
}

void silu_mul_f32(const float *gate, const float *up, float *y, size_t rows, size_t cols,
                  size_t in_stride)
{
    PARALLEL_FOR(threads_for(rows * cols),
        for (size_t r = 0; r < rows; ++r)
            silu_mul_row(gate + r * in_stride, up + r * in_stride, y + r * cols, cols););
}
