/* Convolution through oneDNN's C API (PyPI's onednn-cpu-gomp, GNU OpenMP like our kernels).
 *
 * The library is opened at run time (dlopen), not linked: the extension loads and runs its own
 * kernels when oneDNN is absent.  Its header (onednn-devel-cpu-gomp) is needed at build time
 * only; built without it (ONNX_PARITY_NO_ONEDNN), onednn_open reports so and nothing else runs.
 *
 * A plan (struct onednn_conv) is made once per node, input shape and thread count: the
 * primitive with bias and residual sum as post-ops, its weights reordered once
 * into the layout the primitive reads (a copy owned by the plan), and the reorders between
 * the caller's NCHW and the primitive's layout.  Runs share one workspace for the laid-out
 * source and destination, so runs are serialised by one lock; each uses every thread.
 *
 * The activation runs as our own code over the output (in the NHWC-to-NCHW transpose where the
 * primitive's layout is NHWC, else activation_f32), not as oneDNN's eltwise post-op: that
 * post-op's Relu and Clip turn a NaN into 0 (measured), where ONNX propagates it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"
#include "onednn_internal.h"

static char last_error[512];

const char *onednn_last_error(void)
{
    return last_error;
}

#ifdef ONNX_PARITY_NO_ONEDNN

int onednn_open(const char *path)
{
    (void)path;
    snprintf(last_error, sizeof last_error,
             "the extension was built without oneDNN's header (onednn-devel-cpu-gomp)");
    return -1;
}

onednn_conv *onednn_conv_create(const int64_t *geometry, const float *w, const float *bias,
                                int has_residual, int act, float alpha, float beta, int layout)
{
    (void)geometry, (void)w, (void)bias, (void)has_residual, (void)act, (void)alpha, (void)beta;
    (void)layout;
    onednn_open(NULL);
    return NULL;
}

int onednn_conv_run(onednn_conv *c, const float *x, const float *residual, float *y)
{
    (void)c, (void)x, (void)residual, (void)y;
    return -1;
}

int onednn_conv_run_native(onednn_conv *c, const float *x, float *y)
{
    (void)c, (void)x, (void)y;
    return -1;
}

size_t onednn_conv_native_bytes(const onednn_conv *c, int which)
{
    (void)c, (void)which;
    return 0;
}

const char *onednn_conv_implementation(const onednn_conv *c)
{
    (void)c;
    return "";
}

void onednn_conv_destroy(onednn_conv *c)
{
    (void)c;
}

#else

#include "oneapi/dnnl/dnnl.h"

static struct onednn_api dnnl; /* engine and stream below until onednn_open succeeds */

static void *library;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

/* The source and destination in the primitive's layout, shared by every plan's runs. */
static void *workspace[2];
static size_t workspace_bytes[2];

int onednn_open(const char *path)
{
    pthread_mutex_lock(&open_lock);
    int status = 0;
    if (library != NULL)
        goto done;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        snprintf(last_error, sizeof last_error, "dlopen failed: %s", dlerror());
        status = -1;
        goto done;
    }
#define RESOLVE(name)                                                                              \
    if ((*(void **)&dnnl.name = dlsym(handle, #name)) == NULL) {                                  \
        snprintf(last_error, sizeof last_error, "%s lacks %s", path, #name);                      \
        dlclose(handle);                                                                           \
        status = -1;                                                                               \
        goto done;                                                                                 \
    }
    DNNL_ENTRY_POINTS(RESOLVE)
#undef RESOLVE
    if (dnnl.dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success
        || dnnl.dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        snprintf(last_error, sizeof last_error, "oneDNN could not create a CPU engine and stream");
        dlclose(handle);
        status = -1;
        goto done;
    }
    dnnl.engine = engine, dnnl.stream = stream;
    library = handle;
done:
    pthread_mutex_unlock(&open_lock);
    return status;
}

const struct onednn_api *onednn_api(void)
{
    pthread_mutex_lock(&open_lock);
    const struct onednn_api *api = library != NULL ? &dnnl : NULL;
    pthread_mutex_unlock(&open_lock);
    return api;
}

struct onednn_conv {
    dnnl_primitive_t conv;
    dnnl_primitive_t to_src, to_dst, from_dst; /* reorders; NULL where the layouts agree */
    dnnl_memory_t user_src, user_dst, src, dst, weights, bias;
    int src_nhwc, dst_nhwc;                    /* the primitive's layout is NHWC: own transposes */
    size_t bytes[2];                           /* src, dst in the primitive's layout */
    size_t user_dst_bytes;
    int threads, act;
    float alpha, beta;
    char implementation[128];
    /* for runs on a busy machine: the caller's NCHW weights and bias (kept alive by it) and
     * the geometry, for conv2d_f32 on the calling thread */
    const float *plain_w, *plain_bias;
    int64_t geometry[18];
};

enum { SRC = 0, DST = 1 };

#define CHECK(call, what)                                                                          \
    do {                                                                                           \
        dnnl_status_t s_ = (call);                                                                 \
        if (s_ != dnnl_success) {                                                                  \
            snprintf(last_error, sizeof last_error, "oneDNN %s failed (status %d)", what, (int)s_); \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

dnnl_status_t onednn_make_reorder(dnnl_primitive_t *prim, const_dnnl_memory_desc_t from,
                                  const_dnnl_memory_desc_t to)
{
    dnnl_primitive_desc_t pd;
    dnnl_status_t s = dnnl.dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, NULL);
    if (s != dnnl_success)
        return s;
    s = dnnl.dnnl_primitive_create(prim, pd);
    dnnl.dnnl_primitive_desc_destroy(pd);
    return s;
}

dnnl_status_t onednn_run_reorder(dnnl_primitive_t prim, dnnl_memory_t from, dnnl_memory_t to)
{
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    return dnnl.dnnl_primitive_execute(prim, stream, 2, args);
}

/* NCHW <-> NHWC.  On AVX2 oneDNN's brgconv reads and writes NHWC (its acdb); its own reorders
 * between that and NCHW ran at about 4 GB/s here (64x56x56 at 1 thread: 0.19 ms in, 0.11 ms
 * out), and the activation was one more pass over the output.  These move 8x8 tiles through
 * AVX2 registers, apply the activation while the output is in registers or cache, and split
 * the pixels of each image across the threads (each thread writes whole NHWC rows going in). */
enum { TRANSPOSE_TILE = 64 }; /* pixels per unit of work */

#if defined(__x86_64__)
AVX2 static inline void transpose8x8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* 8 channels x 8 pixels: dst[j * dst_ld + i] = src[i * src_ld + j], Relu (v < 0 ? 0 : v, so
 * NaN and -0 pass as relu_f32 passes them) when relu is set. */
AVX2 static inline void tile8x8(const float *src, size_t src_ld, float *dst, size_t dst_ld,
                                int relu)
{
    __m256 r[8];
    for (int i = 0; i < 8; ++i)
        r[i] = _mm256_loadu_ps(src + i * src_ld);
    transpose8x8(r);
    if (relu) {
        __m256 zero = _mm256_setzero_ps();
        for (int i = 0; i < 8; ++i)
            r[i] = _mm256_andnot_ps(_mm256_cmp_ps(r[i], zero, _CMP_LT_OQ), r[i]);
    }
    for (int i = 0; i < 8; ++i)
        _mm256_storeu_ps(dst + i * dst_ld, r[i]);
}

AVX2 static void tiles_avx2(const float *src, size_t src_ld, float *dst, size_t dst_ld,
                            int64_t rows, int64_t cols, int relu)
{
    for (int64_t i = 0; i + 8 <= rows; i += 8)
        for (int64_t j = 0; j + 8 <= cols; j += 8)
            tile8x8(src + i * src_ld + j, src_ld, dst + j * dst_ld + i, dst_ld, relu);
}
#endif

/* dst[j * dst_ld + i] = src[i * src_ld + j] for i < rows, j < cols; with relu, Relu of it. */
static void transpose_block(const float *src, size_t src_ld, float *dst, size_t dst_ld,
                            int64_t rows, int64_t cols, int relu)
{
    int64_t full_rows = 0, full_cols = 0;
#if defined(__x86_64__)
    if (have_avx2()) {
        full_rows = rows / 8 * 8, full_cols = cols / 8 * 8;
        tiles_avx2(src, src_ld, dst, dst_ld, full_rows, full_cols, relu);
    }
#endif
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = i < full_rows ? full_cols : 0; j < cols; ++j) {
            float v = src[i * src_ld + j];
            dst[j * dst_ld + i] = relu && v < 0.0f ? 0.0f : v;
        }
}

/* The channels of one unit of work: all of them, or where the image has fewer 64-pixel tiles
 * than there are threads (a 7x7 plane at batch 1), a share of them in multiples of 16 (whole
 * 64-byte lines of an NHWC row for each thread). */
static int64_t channel_chunk(int64_t channels, int64_t pixel_units, int threads)
{
    if (pixel_units >= threads || channels < 32)
        return channels;
    int64_t chunk = (channels / threads + 15) / 16 * 16;
    return chunk < channels ? chunk : channels;
}

/* y[b][p][c] = x[b][c][p] (NCHW to NHWC), p < hw. */
static void nchw_to_nhwc(const float *x, float *y, int64_t batch, int64_t channels, int64_t hw,
                         int threads)
{
    int64_t tiles = (hw + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE;
    int useful = threads_for((size_t)(batch * channels * hw)); /* small planes: fewer threads */
    threads = useful < threads ? useful : threads;
    int64_t chunk = channel_chunk(channels, batch * tiles, threads);
    int64_t chunks = (channels + chunk - 1) / chunk, units = batch * tiles * chunks;
    PARALLEL_FOR(threads < units ? threads : (int)units,
        for (int64_t u = 0; u < units; ++u) {
            int64_t b = u / (tiles * chunks), p = u / chunks % tiles * TRANSPOSE_TILE;
            int64_t c = u % chunks * chunk, m = channels - c < chunk ? channels - c : chunk;
            int64_t n = hw - p < TRANSPOSE_TILE ? hw - p : TRANSPOSE_TILE;
            transpose_block(x + (b * channels + c) * hw + p, (size_t)hw,
                            y + (b * hw + p) * channels + c, (size_t)channels, m, n, 0);
        });
}

/* y[b][c][p] = act(x[b][p][c]) (NHWC to NCHW, then the activation). */
static void nhwc_to_nchw(const float *x, float *y, int64_t batch, int64_t channels, int64_t hw,
                         int threads, int act, float alpha, float beta)
{
    int64_t tiles = (hw + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE;
    int useful = threads_for((size_t)(batch * channels * hw)); /* small planes: fewer threads */
    threads = useful < threads ? useful : threads;
    int64_t chunk = channel_chunk(channels, batch * tiles, threads);
    int64_t chunks = (channels + chunk - 1) / chunk, units = batch * tiles * chunks;
    int relu = act == ACT_RELU;
    PARALLEL_FOR(threads < units ? threads : (int)units,
        for (int64_t u = 0; u < units; ++u) {
            int64_t b = u / (tiles * chunks), p = u / chunks % tiles * TRANSPOSE_TILE;
            int64_t c = u % chunks * chunk, m = channels - c < chunk ? channels - c : chunk;
            int64_t n = hw - p < TRANSPOSE_TILE ? hw - p : TRANSPOSE_TILE;
            float *out = y + (b * channels + c) * hw + p;
            transpose_block(x + (b * hw + p) * channels + c, (size_t)channels, out, (size_t)hw,
                            n, m, relu);
            if (act != ACT_NONE && !relu)
                for (int64_t k = 0; k < m; ++k)
                    activate_inplace(out + k * hw, (size_t)n, act, alpha, beta);
        });
}

void onednn_nchw_to_nhwc(const float *x, float *y, int64_t batch, int64_t channels, int64_t hw,
                         int threads)
{
    nchw_to_nhwc(x, y, batch, channels, hw, threads);
}

void onednn_nhwc_to_nchw(const float *x, float *y, int64_t batch, int64_t channels, int64_t hw,
                         int threads)
{
    nhwc_to_nchw(x, y, batch, channels, hw, threads, ACT_NONE, 0.0f, 0.0f);
}

/* geometry: batch, in_c, in_h, in_w, out_c, k_h, k_w, group, stride_h, stride_w, pad_top,
 * pad_left, pad_bottom, pad_right, dil_h, dil_w, out_h, out_w. */
static onednn_conv *create_locked(const int64_t *geometry, const float *w, const float *bias,
                                  int has_residual, int act, float alpha, float beta, int layout);

/* Under run_lock: the weights' reorder runs on the stream that runs share, and last_error is
 * written here too. */
onednn_conv *onednn_conv_create(const int64_t *geometry, const float *w, const float *bias,
                                int has_residual, int act, float alpha, float beta, int layout)
{
    pthread_mutex_lock(&run_lock);
    onednn_conv *c = create_locked(geometry, w, bias, has_residual, act, alpha, beta, layout);
    pthread_mutex_unlock(&run_lock);
    return c;
}

static onednn_conv *create_locked(const int64_t *geometry, const float *w, const float *bias,
                                  int has_residual, int act, float alpha, float beta, int layout)
{
    if (library == NULL) {
        snprintf(last_error, sizeof last_error, "oneDNN is not opened (onednn_open)");
        return NULL;
    }
    const int64_t *g = geometry;
    int64_t batch = g[0], in_c = g[1], in_h = g[2], in_w = g[3], out_c = g[4], k_h = g[5],
            k_w = g[6], group = g[7];
    dnnl_dims_t src_dims = {batch, in_c, in_h, in_w}, dst_dims = {batch, out_c, g[16], g[17]};
    dnnl_dims_t w_dims = {group, out_c / group, in_c / group, k_h, k_w}, b_dims = {out_c};
    dnnl_dims_t strides = {g[8], g[9]}, pad_l = {g[10], g[11]}, pad_r = {g[12], g[13]};
    dnnl_dims_t dilates = {g[14] - 1, g[15] - 1}; /* oneDNN counts the gaps between taps */
    dnnl_format_tag_t data_tag = layout == ONEDNN_LAYOUT_PLAIN ? dnnl_nchw : dnnl_format_tag_any;

    onednn_conv *c = calloc(1, sizeof *c);
    dnnl_memory_desc_t user_src = NULL, user_dst = NULL, user_w = NULL, any_src = NULL,
                       any_dst = NULL, any_w = NULL, b_md = NULL, nhwc_src = NULL,
                       nhwc_dst = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_t user_weights = NULL;
    dnnl_primitive_t weight_reorder = NULL;
    if (c == NULL) {
        snprintf(last_error, sizeof last_error, "out of memory");
        return NULL;
    }
    c->threads = kernels_configured_threads();
    omp_set_num_threads(c->threads); /* the primitive is built for the threads it will run on */
    c->plain_w = w, c->plain_bias = bias;
    memcpy(c->geometry, geometry, sizeof c->geometry);

    CHECK(dnnl.dnnl_memory_desc_create_with_tag(&user_src, 4, src_dims, dnnl_f32, dnnl_nchw), "source desc");
    CHECK(dnnl.dnnl_memory_desc_create_with_tag(&user_dst, 4, dst_dims, dnnl_f32, dnnl_nchw), "destination desc");
    CHECK(dnnl.dnnl_memory_desc_create_with_tag(&user_w, 5, w_dims, dnnl_f32, dnnl_goihw), "weights desc");
    CHECK(dnnl.dnnl_memory_desc_create_with_tag(&any_src, 4, src_dims, dnnl_f32, data_tag), "source desc");
    CHECK(dnnl.dnnl_memory_desc_create_with_tag(&any_dst, 4, dst_dims, dnnl_f32, data_tag), "destination desc");
    CHECK(dnnl.dnnl_memory_desc_create_with_tag(&any_w, 5, w_dims, dnnl_f32, dnnl_format_tag_any), "weights desc");
    if (bias != NULL)
        CHECK(dnnl.dnnl_memory_desc_create_with_tag(&b_md, 1, b_dims, dnnl_f32, dnnl_x), "bias desc");

    CHECK(dnnl.dnnl_post_ops_create(&ops), "post-ops");
    if (has_residual)
        CHECK(dnnl.dnnl_post_ops_append_sum(ops, 1.0f, 0, dnnl_data_type_undef), "sum post-op");
    if (act < ACT_NONE || act > ACT_HARD_SWISH) {
        snprintf(last_error, sizeof last_error, "unknown activation code %d", act);
        goto fail;
    }
    c->act = act, c->alpha = alpha, c->beta = beta;
    CHECK(dnnl.dnnl_primitive_attr_create(&attr), "attributes");
    CHECK(dnnl.dnnl_primitive_attr_set_post_ops(attr, ops), "attributes");
    CHECK(dnnl.dnnl_convolution_forward_primitive_desc_create(
              &pd, engine, dnnl_forward_inference, dnnl_convolution_direct, any_src, any_w, b_md,
              any_dst, strides, dilates, pad_l, pad_r, attr), "convolution descriptor");
    CHECK(dnnl.dnnl_primitive_create(&c->conv, pd), "convolution primitive");
    const char *impl = NULL;
    if (dnnl.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        snprintf(c->implementation, sizeof c->implementation, "%s", impl);

    const_dnnl_memory_desc_t src_md = dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const_dnnl_memory_desc_t dst_md = dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    const_dnnl_memory_desc_t w_md = dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    c->bytes[SRC] = dnnl.dnnl_memory_desc_get_size(src_md);
    c->bytes[DST] = dnnl.dnnl_memory_desc_get_size(dst_md);
    c->user_dst_bytes = dnnl.dnnl_memory_desc_get_size(user_dst);
    CHECK(dnnl.dnnl_memory_create(&c->user_src, user_src, engine, DNNL_MEMORY_NONE), "memory");
    CHECK(dnnl.dnnl_memory_create(&c->user_dst, user_dst, engine, DNNL_MEMORY_NONE), "memory");
    CHECK(dnnl.dnnl_memory_create(&c->src, src_md, engine, DNNL_MEMORY_NONE), "memory");
    CHECK(dnnl.dnnl_memory_create(&c->dst, dst_md, engine, DNNL_MEMORY_NONE), "memory");
    if (layout != ONEDNN_LAYOUT_PLAIN) {
        CHECK(dnnl.dnnl_memory_desc_create_with_tag(&nhwc_src, 4, src_dims, dnnl_f32, dnnl_acdb), "source desc");
        CHECK(dnnl.dnnl_memory_desc_create_with_tag(&nhwc_dst, 4, dst_dims, dnnl_f32, dnnl_acdb), "destination desc");
        c->src_nhwc = dnnl.dnnl_memory_desc_equal(src_md, nhwc_src)
                      && !dnnl.dnnl_memory_desc_equal(src_md, user_src);
        c->dst_nhwc = dnnl.dnnl_memory_desc_equal(dst_md, nhwc_dst)
                      && !dnnl.dnnl_memory_desc_equal(dst_md, user_dst);
    }
    if (!dnnl.dnnl_memory_desc_equal(src_md, user_src))
        CHECK(onednn_make_reorder(&c->to_src, user_src, src_md), "source reorder");
    if (!dnnl.dnnl_memory_desc_equal(dst_md, user_dst)) {
        CHECK(onednn_make_reorder(&c->from_dst, dst_md, user_dst), "destination reorder");
        if (has_residual)
            CHECK(onednn_make_reorder(&c->to_dst, user_dst, dst_md), "residual reorder");
    }

    /* weights (and bias) copied once into memory the plan owns, in the primitive's layout */
    CHECK(dnnl.dnnl_memory_create(&c->weights, w_md, engine, DNNL_MEMORY_ALLOCATE), "weights memory");
    CHECK(dnnl.dnnl_memory_create(&user_weights, user_w, engine, (void *)w), "weights memory");
    CHECK(onednn_make_reorder(&weight_reorder, user_w, w_md), "weights reorder");
    CHECK(onednn_run_reorder(weight_reorder, user_weights, c->weights), "weights reorder");
    if (bias != NULL) {
        const_dnnl_memory_desc_t bias_md = dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1);
        dnnl_memory_t user_bias = NULL;
        dnnl_primitive_t bias_reorder = NULL;
        CHECK(dnnl.dnnl_memory_create(&c->bias, bias_md, engine, DNNL_MEMORY_ALLOCATE), "bias memory");
        CHECK(dnnl.dnnl_memory_create(&user_bias, b_md, engine, (void *)bias), "bias memory");
        dnnl_status_t s = onednn_make_reorder(&bias_reorder, b_md, bias_md);
        if (s == dnnl_success)
            s = onednn_run_reorder(bias_reorder, user_bias, c->bias);
        if (bias_reorder != NULL)
            dnnl.dnnl_primitive_destroy(bias_reorder);
        dnnl.dnnl_memory_destroy(user_bias);
        CHECK(s, "bias reorder");
    }
    CHECK(dnnl.dnnl_stream_wait(stream), "weights reorder");
    goto done;
fail:
    onednn_conv_destroy(c);
    c = NULL;
done:
    if (weight_reorder != NULL) dnnl.dnnl_primitive_destroy(weight_reorder);
    if (user_weights != NULL) dnnl.dnnl_memory_destroy(user_weights);
    if (pd != NULL) dnnl.dnnl_primitive_desc_destroy(pd);
    if (attr != NULL) dnnl.dnnl_primitive_attr_destroy(attr);
    if (ops != NULL) dnnl.dnnl_post_ops_destroy(ops);
    dnnl_memory_desc_t mds[] = {user_src, user_dst, user_w, any_src, any_dst, any_w, b_md,
                                nhwc_src, nhwc_dst};
    for (size_t i = 0; i < sizeof mds / sizeof mds[0]; ++i)
        if (mds[i] != NULL)
            dnnl.dnnl_memory_desc_destroy(mds[i]);
    return c;
}

/* Workspace slot `which` of at least `bytes`, or NULL; called with run_lock held. */
static void *workspace_for(int which, size_t bytes)
{
    if (workspace_bytes[which] < bytes) {
        free(workspace[which]);
        size_t rounded = (bytes + 4095) / 4096 * 4096;
        workspace[which] = aligned_alloc(4096, rounded);
        workspace_bytes[which] = workspace[which] != NULL ? rounded : 0;
    }
    return workspace[which];
}

static dnnl_status_t execute(onednn_conv *c, void *src, void *dst)
{
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, c->src}, {DNNL_ARG_WEIGHTS, c->weights},
                               {DNNL_ARG_DST, c->dst}, {DNNL_ARG_BIAS, c->bias}};
    dnnl.dnnl_memory_set_data_handle(c->src, src);
    dnnl.dnnl_memory_set_data_handle(c->dst, dst);
    return dnnl.dnnl_primitive_execute(c->conv, stream, c->bias != NULL ? 4 : 3, args);
}

/* y = act(conv(x) + bias + residual) with x, residual and y in NCHW; y may be residual. */
/* The convolution by our own kernel on the calling thread alone: oneDNN's primitive splits
 * its work for the team it was built for, and on an oversubscribed machine (the threads.c
 * check) that team's barriers wait for threads without a core (mobilenet_v3_small at 2
 * threads, load 11: 16x onnxruntime). */
static int run_plain(const onednn_conv *c, const float *x, const float *residual, float *y)
{
    const int64_t *g = c->geometry;
    float *copy = NULL;
    if (residual != NULL && residual == y) { /* conv2d_f32 writes y before it adds the residual */
        size_t bytes = c->user_dst_bytes;
        if ((copy = malloc(bytes)) == NULL)
            return -1;
        memcpy(copy, residual, bytes);
        residual = copy;
    }
    int status = conv2d_f32(x, g[0], g[1], g[2], g[3], c->plain_w, g[4], g[5], g[6], g[7], g[8],
                            g[9], g[10], g[11], g[14], g[15], c->plain_bias, residual, y, g[16],
                            g[17], c->act, c->alpha, c->beta);
    free(copy);
    return status;
}

int onednn_conv_run(onednn_conv *c, const float *x, const float *residual, float *y)
{
    if (kernels_get_num_threads() < c->threads)
        return run_plain(c, x, residual, y);
    int status = -1;
    pthread_mutex_lock(&run_lock);
    omp_set_num_threads(c->threads);
    const int64_t *g = c->geometry;
    int64_t in_hw = g[2] * g[3], out_hw = g[16] * g[17];
    void *src = (void *)x, *dst = y;
    if (c->to_src != NULL) {
        src = workspace_for(SRC, c->bytes[SRC]);
        if (src == NULL) goto out;
        if (c->src_nhwc) {
            nchw_to_nhwc(x, src, g[0], g[1], in_hw, c->threads);
        } else {
            dnnl.dnnl_memory_set_data_handle(c->user_src, (void *)x);
            dnnl.dnnl_memory_set_data_handle(c->src, src);
            if (onednn_run_reorder(c->to_src, c->user_src, c->src) != dnnl_success) goto out;
        }
    }
    if (c->from_dst != NULL) {
        dst = workspace_for(DST, c->bytes[DST]);
        if (dst == NULL) goto out;
        if (residual != NULL && c->dst_nhwc) {
            nchw_to_nhwc(residual, dst, g[0], g[4], out_hw, c->threads);
        } else if (residual != NULL) {
            dnnl.dnnl_memory_set_data_handle(c->user_dst, (void *)residual);
            dnnl.dnnl_memory_set_data_handle(c->dst, dst);
            if (onednn_run_reorder(c->to_dst, c->user_dst, c->dst) != dnnl_success) goto out;
        }
    } else if (residual != NULL && residual != y) {
        memcpy(y, residual, c->user_dst_bytes);
    }
    if (execute(c, src, dst) != dnnl_success) goto out;
    if (c->dst_nhwc) {
        if (dnnl.dnnl_stream_wait(stream) != dnnl_success) goto out;
        nhwc_to_nchw(dst, y, g[0], g[4], out_hw, c->threads, c->act, c->alpha, c->beta);
        status = 0;
        goto out;
    }
    if (c->from_dst != NULL) {
        dnnl.dnnl_memory_set_data_handle(c->user_dst, y);
        if (onednn_run_reorder(c->from_dst, c->dst, c->user_dst) != dnnl_success) goto out;
    }
    status = dnnl.dnnl_stream_wait(stream) == dnnl_success ? 0 : -1;
    if (status == 0 && c->act != ACT_NONE)
        activation_f32(y, y, c->user_dst_bytes / sizeof(float), c->act, c->alpha, c->beta);
out:
    pthread_mutex_unlock(&run_lock);
    return status;
}

/* The convolution alone, x and y already in the primitive's layout (onednn_conv_native_bytes
 * each); a residual is whatever y holds before the call.  The activation covers the whole
 * buffer, a blocked layout's padding channels included. */
int onednn_conv_run_native(onednn_conv *c, const float *x, float *y)
{
    pthread_mutex_lock(&run_lock);
    omp_set_num_threads(c->threads);
    int status = execute(c, (void *)x, y) == dnnl_success
                 && dnnl.dnnl_stream_wait(stream) == dnnl_success ? 0 : -1;
    if (status == 0 && c->act != ACT_NONE)
        activation_f32(y, y, c->bytes[DST] / sizeof(float), c->act, c->alpha, c->beta);
    pthread_mutex_unlock(&run_lock);
    return status;
}

size_t onednn_conv_native_bytes(const onednn_conv *c, int which)
{
    return c->bytes[which == 0 ? SRC : DST];
}

const char *onednn_conv_implementation(const onednn_conv *c)
{
    return c->implementation;
}

void onednn_conv_destroy(onednn_conv *c)
{
    if (c == NULL)
        return;
    dnnl_primitive_t prims[] = {c->conv, c->to_src, c->to_dst, c->from_dst};
    for (size_t i = 0; i < sizeof prims / sizeof prims[0]; ++i)
        if (prims[i] != NULL)
            dnnl.dnnl_primitive_destroy(prims[i]);
    dnnl_memory_t mems[] = {c->user_src, c->user_dst, c->src, c->dst, c->weights, c->bias};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i)
        if (mems[i] != NULL)
            dnnl.dnnl_memory_destroy(mems[i]);
    free(c);
}

#endif
