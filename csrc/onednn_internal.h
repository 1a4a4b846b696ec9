/* Shared by the oneDNN sources (onednn_conv.c, onednn_region.c), not part of the cffi API. */
#ifndef ONEDNN_INTERNAL_H
#define ONEDNN_INTERNAL_H

#ifndef ONNX_PARITY_NO_ONEDNN
#include "oneapi/dnnl/dnnl.h"

/* The entry points used, resolved from the opened library. */
#define DNNL_ENTRY_POINTS(X)                                                                      \
    X(dnnl_engine_create) X(dnnl_stream_create) X(dnnl_stream_wait)                               \
    X(dnnl_memory_desc_create_with_tag) X(dnnl_memory_desc_destroy) X(dnnl_memory_desc_equal)     \
    X(dnnl_memory_desc_get_size) X(dnnl_memory_desc_clone) X(dnnl_memory_create)                  \
    X(dnnl_memory_set_data_handle) X(dnnl_memory_destroy) X(dnnl_primitive_attr_create)           \
    X(dnnl_primitive_attr_destroy) X(dnnl_primitive_attr_set_post_ops) X(dnnl_post_ops_create)    \
    X(dnnl_post_ops_destroy) X(dnnl_post_ops_append_sum)                                          \
    X(dnnl_convolution_forward_primitive_desc_create) X(dnnl_reorder_primitive_desc_create)       \
    X(dnnl_primitive_desc_query_md) X(dnnl_primitive_desc_query) X(dnnl_primitive_desc_destroy)   \
    X(dnnl_primitive_create) X(dnnl_primitive_execute) X(dnnl_primitive_destroy)                  \
    X(dnnl_memory_get_memory_desc)

/* The library's entry points with the CPU engine and the stream every oneDNN run uses. */
struct onednn_api {
#define DECLARE(name) __typeof__(&name) name;
    DNNL_ENTRY_POINTS(DECLARE)
#undef DECLARE
    dnnl_engine_t engine;
    dnnl_stream_t stream;
};

/* What onednn_open resolved and made, or NULL before it succeeded. */
const struct onednn_api *onednn_api(void);

/* A reorder primitive between two layouts, and one run of it on the shared stream. */
dnnl_status_t onednn_make_reorder(dnnl_primitive_t *prim, const_dnnl_memory_desc_t from,
                                  const_dnnl_memory_desc_t to);
dnnl_status_t onednn_run_reorder(dnnl_primitive_t prim, dnnl_memory_t from, dnnl_memory_t to);

/* NCHW <-> NHWC of float32 images (AVX2 8x8 tiles), on up to `threads` threads. */
void onednn_nchw_to_nhwc(const float *x, float *y, int64_t batch, int64_t channels, int64_t hw,
                         int threads);
void onednn_nhwc_to_nchw(const float *x, float *y, int64_t batch, int64_t channels, int64_t hw,
                         int threads);
#endif

#endif
