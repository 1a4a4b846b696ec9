#include "kernels.h"

void relu_f32(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        float v = x[i];
        /* Written as a comparison that is false for NaN, so NaN propagates as in the spec. */
        y[i] = (v < 0.0f) ? 0.0f : v;
    }
}
