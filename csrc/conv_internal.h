/* What conv.c and depthwise.c share; not part of the cffi interface. */
#ifndef CONV_INTERNAL_H
#define CONV_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

/* 64-bit throughout (see internal.h); only the arguments of BLAS calls are int, and the
 * wrapper keeps those (GEMM depth, output plane, channels per group) within 2^31 - 1. */
struct conv_geometry {
    int64_t channels, in_h, in_w, k_h, k_w, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w;
    int64_t out_h, out_w;
};

/* The output step of a convolution: y = act(y + bias + residual), per output channel. */
struct conv_output {
    const float *bias, *residual;
    int act;
    float alpha, beta;
};

/* The output step of output plane p (image p / out_c, channel p % out_c), while it is in cache. */
void conv_finish_plane(const struct conv_output *o, float *y, int64_t p, int64_t out_c,
                       size_t plane);

/* Depthwise convolutions (one input channel per group), in depthwise.c. */
int conv_depthwise3x3(const float *x, const struct conv_geometry *g, int64_t batch,
                      int64_t group, const float *w, int64_t out_c, float *y,
                      const struct conv_output *o);
int phased_fits(const struct conv_geometry *g, size_t in_plane, size_t plane);
int conv_depthwise_phased(const float *x, const struct conv_geometry *g, int64_t batch,
                          int64_t group, const float *w, int64_t out_c, float *y,
                          const struct conv_output *o);

/* Convolutions as one GEMM with the output step fused, on AVX2 (conv_pointwise.c): 1x1
 * stride-1 unpadded ones, and direct ones for few input channels (group 1).  Call only where
 * conv_avx2_available(); -1 when out of memory. */
int conv_avx2_available(void);
int conv_pointwise_avx2(const float *x, int64_t batch, int64_t in_c, int64_t group,
                        const float *w, int64_t out_c, size_t plane, float *y,
                        const struct conv_output *o);
int stem_fits(const struct conv_geometry *g);
int conv_stem_avx2(const float *x, const struct conv_geometry *g, int64_t batch,
                   const float *w, int64_t out_c, float *y, const struct conv_output *o);

#endif
