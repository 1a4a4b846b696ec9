/* C kernels exported to Python through cffi (declarations shared by build.py's cdef). */
#include <stddef.h>
#include <stdint.h>

/* y[i] = max(x[i], 0); NaN passes through.  x and y may alias. */
void relu_f32(const float *x, float *y, size_t n);
