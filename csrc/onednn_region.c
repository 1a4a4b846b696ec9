/* An NHWC region: several convolutions, activations, residual adds, channel concats and pools
 * run back to back over NHWC buffers (oneDNN's brgconv layout on AVX2), with transposes from
 * and to NCHW only where values enter and leave the region.
 *
 * A region is described op by op over numbered values (onednn_region_entry, _conv, ...), then
 * onednn_region_finish lays the values out in buffers the region owns (a value reuses the
 * buffer of one whose last use came before it; an activation, residual sum or add writes in
 * place over an input that dies there) and creates the reorders.  Primitives and weight
 * reorders are made once, for one input shape and the thread count configured then.
 *
 * Activations run as our own kernel (activation_f32) over the whole buffer, padding channels
 * included where oneDNN refused NHWC and picked a blocked layout: oneDNN's eltwise post-op
 * turns NaN into 0 where ONNX keeps it.  The caller admits only activations with f(0) = 0, so
 * zero padding channels stay zero. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"
#include "onednn_internal.h"

static char last_error[512];

const char *onednn_region_last_error(void)
{
    return last_error;
}

#ifdef ONNX_PARITY_NO_ONEDNN

onednn_region *onednn_region_create(int64_t values)
{
    (void)values;
    snprintf(last_error, sizeof last_error,
             "the extension was built without oneDNN's header (onednn-devel-cpu-gomp)");
    return NULL;
}
int onednn_region_entry(onednn_region *r, int64_t value, const int64_t *dims)
{ (void)r, (void)value, (void)dims; return -1; }
int onednn_region_conv(onednn_region *r, int64_t src, int64_t residual, int64_t dst,
                       const int64_t *geometry, const float *w, const float *bias, int act,
                       float alpha, float beta, const int64_t *ties)
{ (void)r, (void)src, (void)residual, (void)dst, (void)geometry, (void)w, (void)bias, (void)act,
  (void)alpha, (void)beta, (void)ties; return -1; }
int onednn_region_activation(onednn_region *r, int64_t src, int64_t dst, int act, float alpha,
                             float beta)
{ (void)r, (void)src, (void)dst, (void)act, (void)alpha, (void)beta; return -1; }
int onednn_region_add(onednn_region *r, int64_t a, int64_t b, int64_t dst)
{ (void)r, (void)a, (void)b, (void)dst; return -1; }
int onednn_region_concat(onednn_region *r, const int64_t *srcs, int64_t count, int64_t dst)
{ (void)r, (void)srcs, (void)count, (void)dst; return -1; }
int onednn_region_pool(onednn_region *r, int64_t src, int64_t dst, int kind, const int64_t *geometry)
{ (void)r, (void)src, (void)dst, (void)kind, (void)geometry; return -1; }
int onednn_region_exit(onednn_region *r, int64_t value) { (void)r, (void)value; return -1; }
int onednn_region_set_threads(onednn_region *r, int threads) { (void)r, (void)threads; return -1; }
int onednn_region_attach_single(onednn_region *r, onednn_region *single) { (void)r, (void)single; return -1; }
long long onednn_region_single_runs(const onednn_region *r) { (void)r; return -1; }
int onednn_region_finish(onednn_region *r) { (void)r; return -1; }
int onednn_region_run(onednn_region *r, const float *const *inputs, float *const *outputs)
{ (void)r, (void)inputs, (void)outputs; return -1; }
int onednn_region_run_slots(onednn_region *r, void *const *slots, const int32_t *slot_ids)
{ (void)r, (void)slots, (void)slot_ids; return -1; }
void onednn_region_destroy(onednn_region *r) { (void)r; }

#else

#include "oneapi/dnnl/dnnl.h"

static struct onednn_api dnnl;
static pthread_mutex_t setup_lock = PTHREAD_MUTEX_INITIALIZER;
static int ready;
static dnnl_engine_t engine;
static dnnl_stream_t stream;

/* Takes the entry points, engine and stream onednn_open made (onednn_conv.c); 0 or -1. */
static int setup(void)
{
    pthread_mutex_lock(&setup_lock);
    int status = 0;
    if (!ready) {
        const struct onednn_api *api = onednn_api();
        if (api == NULL) {
            snprintf(last_error, sizeof last_error, "oneDNN is not opened (onednn_open)");
            status = -1;
        } else {
            dnnl = *api, engine = api->engine, stream = api->stream;
            ready = 1;
        }
    }
    pthread_mutex_unlock(&setup_lock);
    return status;
}

enum { OP_ENTRY, OP_CONV, OP_ACT, OP_ADD, OP_CONCAT, OP_POOL, OP_EXIT };
enum { REGION_MAX = 0, REGION_AVG_EXCLUDE_PAD = 1, REGION_AVG_INCLUDE_PAD = 2 };
#define MAX_CONCAT 16

typedef struct {
    int kind;
    int64_t in[MAX_CONCAT];
    int64_t n_in, out, user; /* user: entry or exit index */
    int act, copy_residual, pool, ties_nhwc, nhwc; /* nhwc: an entry or exit transposed by us */
    float alpha, beta;
    int64_t *ties; /* conv: per output channel the channel it copies (its tied twin), or NULL */
    int64_t *tie_runs, n_tie_runs; /* ties as copy_tied_channels' runs (NHWC) */
    int64_t geometry[8]; /* pools: k_h, k_w, stride_h, stride_w, pad_top, pad_left, out_h, out_w */
    dnnl_primitive_t prim;
    dnnl_memory_t from, to, weights, bias; /* handles set per run (weights and bias owned) */
    int weights_borrowed; /* weights are the multi-thread twin's (onednn_region_attach_single) */
    int relu_later; /* conv: its Relu is applied by the NHWC concat reading it (its one reader) */
    char relu_in[MAX_CONCAT]; /* NHWC concat: inputs it applies Relu to as it copies them */
} region_op;

typedef struct {
    dnnl_dims_t dims; /* 4 used */
    dnnl_memory_desc_t md; /* NULL until a producer or consumer fixes the layout */
    size_t bytes;
    int64_t buffer, last_use, defined;
} region_value;

struct onednn_region {
    region_op *ops;
    int64_t n_ops, cap_ops, n_values, n_inputs, n_outputs, n_buffers;
    region_value *values;
    void **buffers;
    size_t *buffer_bytes;
    int threads, finished;
    pthread_mutex_t lock;
    /* the same region planned for one thread (owned), run in its place when the kernels fall
     * back to the calling thread on a busy machine; NULL at one thread */
    struct onednn_region *single;
    long long runs; /* runs of this region itself (not through its twin) */
};

#define CHECK(call, what)                                                                          \
    do {                                                                                           \
        dnnl_status_t s_ = (call);                                                                 \
        if (s_ != dnnl_success) {                                                                  \
            snprintf(last_error, sizeof last_error, "oneDNN %s failed (status %d)", what, (int)s_); \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(last_error, sizeof last_error, __VA_ARGS__);                                  \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

onednn_region *onednn_region_create(int64_t values)
{
    if (setup() != 0)
        return NULL;
    onednn_region *r = calloc(1, sizeof *r);
    if (r == NULL || values <= 0 || (r->values = calloc((size_t)values, sizeof *r->values)) == NULL) {
        snprintf(last_error, sizeof last_error, "out of memory (or no values)");
        free(r);
        return NULL;
    }
    r->n_values = values;
    for (int64_t v = 0; v < values; ++v)
        r->values[v].buffer = r->values[v].last_use = -1;
    r->threads = kernels_configured_threads();
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

static region_op *add_op(onednn_region *r, int kind)
{
    if (r->finished) {
        snprintf(last_error, sizeof last_error, "the region is finished");
        return NULL;
    }
    if (r->n_ops == r->cap_ops) {
        int64_t cap = r->cap_ops ? 2 * r->cap_ops : 16;
        region_op *ops = realloc(r->ops, (size_t)cap * sizeof *ops);
        if (ops == NULL) {
            snprintf(last_error, sizeof last_error, "out of memory");
            return NULL;
        }
        r->ops = ops, r->cap_ops = cap;
    }
    region_op *op = &r->ops[r->n_ops++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->out = op->user = -1;
    return op;
}

static int valid(const onednn_region *r, int64_t v, int defined)
{
    if (v < 0 || v >= r->n_values || r->values[v].defined != defined) {
        snprintf(last_error, sizeof last_error, "value %lld is %s", (long long)v,
                 defined ? "not defined yet" : "out of range or defined twice");
        return 0;
    }
    return 1;
}

static dnnl_status_t tagged(dnnl_memory_desc_t *md, const dnnl_dims_t dims, dnnl_format_tag_t tag)
{
    return dnnl.dnnl_memory_desc_create_with_tag(md, 4, dims, dnnl_f32, tag);
}

/* Fixes v's layout to md (a copy) and its size. */
static int set_md(region_value *v, const_dnnl_memory_desc_t md)
{
    if (dnnl.dnnl_memory_desc_clone(&v->md, md) != dnnl_success) {
        snprintf(last_error, sizeof last_error, "oneDNN memory descriptor copy failed");
        return -1;
    }
    v->bytes = dnnl.dnnl_memory_desc_get_size(md);
    return 0;
}

/* v in NHWC where nothing fixed its layout before. */
static int default_md(region_value *v)
{
    if (v->md != NULL)
        return 0;
    dnnl_memory_desc_t md = NULL;
    if (tagged(&md, v->dims, dnnl_acdb) != dnnl_success) {
        snprintf(last_error, sizeof last_error, "oneDNN NHWC descriptor failed");
        return -1;
    }
    int status = set_md(v, md);
    dnnl.dnnl_memory_desc_destroy(md);
    return status;
}

/* Whether v is laid out as NHWC (acdb) or nchw, the layouts concat and pools read. */
static int has_tag(const region_value *v, dnnl_format_tag_t tag)
{
    dnnl_memory_desc_t md = NULL;
    if (v->md == NULL || tagged(&md, v->dims, tag) != dnnl_success)
        return 0;
    int equal = dnnl.dnnl_memory_desc_equal(md, v->md);
    dnnl.dnnl_memory_desc_destroy(md);
    return equal;
}

int onednn_region_entry(onednn_region *r, int64_t value, const int64_t *dims)
{
    if (!valid(r, value, 0))
        return -1;
    region_op *op = add_op(r, OP_ENTRY);
    if (op == NULL)
        return -1;
    op->out = value;
    op->user = r->n_inputs++;
    memcpy(r->values[value].dims, dims, 4 * sizeof *dims);
    r->values[value].defined = 1;
    return 0;
}

static int64_t tie_runs(const int64_t *ties, int64_t channels, int64_t **runs);

/* geometry as onednn_conv_create's: batch, in_c, in_h, in_w, out_c, k_h, k_w, group, stride_h,
 * stride_w, pad_top, pad_left, pad_bottom, pad_right, dil_h, dil_w, out_h, out_w. */
int onednn_region_conv(onednn_region *r, int64_t src, int64_t residual, int64_t dst,
                       const int64_t *g, const float *w, const float *bias, int act,
                       float alpha, float beta, const int64_t *ties)
{
    if (!valid(r, src, 1) || (residual >= 0 && !valid(r, residual, 1)) || !valid(r, dst, 0))
        return -1;
    int status = -1;
    region_value *x = &r->values[src], *y = &r->values[dst];
    int64_t group = g[7];
    dnnl_dims_t dst_dims = {g[0], g[4], g[16], g[17]};
    dnnl_dims_t w_dims = {group, g[4] / group, g[1] / group, g[5], g[6]}, b_dims = {g[4]};
    dnnl_dims_t strides = {g[8], g[9]}, pad_l = {g[10], g[11]}, pad_r = {g[12], g[13]};
    dnnl_dims_t dilates = {g[14] - 1, g[15] - 1};
    dnnl_memory_desc_t any_src = NULL, any_dst = NULL, any_w = NULL, user_w = NULL, b_md = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_t user_weights = NULL, user_bias = NULL;
    dnnl_primitive_t weight_reorder = NULL, bias_reorder = NULL;
    region_op *op = NULL;

    REQUIRE(x->dims[0] == g[0] && x->dims[1] == g[1] && x->dims[2] == g[2] && x->dims[3] == g[3],
            "convolution geometry does not match its input's shape");
    REQUIRE(act >= ACT_NONE && act <= ACT_HARD_SWISH, "unknown activation code %d", act);
    if (residual >= 0) {
        region_value *z = &r->values[residual];
        if (default_md(z) != 0)
            goto fail;
        REQUIRE( memcmp(z->dims, dst_dims, sizeof z->dims) == 0,
                "the residual's shape or layout does not fit the convolution's output");
    }
    op = add_op(r, OP_CONV);
    if (op == NULL)
        goto fail;
    op->in[0] = src, op->in[1] = residual, op->n_in = residual >= 0 ? 2 : 1, op->out = dst;
    op->act = act, op->alpha = alpha, op->beta = beta;
    omp_set_num_threads(r->threads);
    /* NHWC between ops (brgconv's layout on AVX2), which concat and pools read; the layout
     * oneDNN picks where it refuses that */
    for (int attempt = 0; attempt < 2 && pd == NULL; ++attempt) {
        dnnl_format_tag_t src_tag = attempt == 0 ? dnnl_acdb : dnnl_format_tag_any;
        dnnl_format_tag_t dst_tag = attempt == 0 ? dnnl_acdb : dnnl_format_tag_any;
        if (any_src != NULL) dnnl.dnnl_memory_desc_destroy(any_src);
        if (any_dst != NULL) dnnl.dnnl_memory_desc_destroy(any_dst);
        any_src = any_dst = NULL;
        if (x->md == NULL)
            CHECK(dnnl.dnnl_memory_desc_create_with_tag(&any_src, 4, x->dims, dnnl_f32, src_tag), "source desc");
        if (residual < 0)
            CHECK(dnnl.dnnl_memory_desc_create_with_tag(&any_dst, 4, dst_dims, dnnl_f32, dst_tag), "destination desc");
        if (any_w == NULL) {
            CHECK(dnnl.dnnl_memory_desc_create_with_tag(&any_w, 5, w_dims, dnnl_f32, dnnl_format_tag_any), "weights desc");
            CHECK(dnnl.dnnl_memory_desc_create_with_tag(&user_w, 5, w_dims, dnnl_f32, dnnl_goihw), "weights desc");
            if (bias != NULL)
                CHECK(dnnl.dnnl_memory_desc_create_with_tag(&b_md, 1, b_dims, dnnl_f32, dnnl_x), "bias desc");
            CHECK(dnnl.dnnl_post_ops_create(&post), "post-ops");
            if (residual >= 0)
                CHECK(dnnl.dnnl_post_ops_append_sum(post, 1.0f, 0, dnnl_data_type_undef), "sum post-op");
            CHECK(dnnl.dnnl_primitive_attr_create(&attr), "attributes");
            CHECK(dnnl.dnnl_primitive_attr_set_post_ops(attr, post), "attributes");
        }
        dnnl_status_t made = dnnl.dnnl_convolution_forward_primitive_desc_create(
            &pd, engine, dnnl_forward_inference, dnnl_convolution_direct,
            x->md != NULL ? x->md : any_src, any_w, b_md,
            residual >= 0 ? r->values[residual].md : any_dst, strides, dilates, pad_l, pad_r, attr);
        if (made != dnnl_success) {
            pd = NULL;
            if (attempt == 1)
                CHECK(made, "convolution descriptor");
        }
    }
    CHECK(dnnl.dnnl_primitive_create(&op->prim, pd), "convolution primitive");
    const_dnnl_memory_desc_t src_md = dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const_dnnl_memory_desc_t dst_md = dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    const_dnnl_memory_desc_t w_md = dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (x->md == NULL && set_md(x, src_md) != 0)
        goto fail;
    memcpy(y->dims, dst_dims, sizeof y->dims);
    if (set_md(y, dst_md) != 0)
        goto fail;
    y->defined = 1;
    if (ties != NULL) {
        REQUIRE(residual < 0, "tied channels are copied only without a residual");
        op->ties_nhwc = has_tag(y, dnnl_acdb);
        REQUIRE(op->ties_nhwc || has_tag(y, dnnl_nchw),
                "tied channels in a layout other than nchw or NHWC");
        op->ties = malloc((size_t)g[4] * sizeof *op->ties);
        REQUIRE(op->ties != NULL, "out of memory");
        memcpy(op->ties, ties, (size_t)g[4] * sizeof *op->ties);
        op->n_tie_runs = tie_runs(ties, g[4], &op->tie_runs);
        REQUIRE(op->n_tie_runs >= 0, "out of memory");
    }
    CHECK(dnnl.dnnl_memory_create(&op->from, src_md, engine, DNNL_MEMORY_NONE), "memory");
    CHECK(dnnl.dnnl_memory_create(&op->to, dst_md, engine, DNNL_MEMORY_NONE), "memory");
    CHECK(dnnl.dnnl_memory_create(&op->weights, w_md, engine, DNNL_MEMORY_ALLOCATE), "weights memory");
    CHECK(dnnl.dnnl_memory_create(&user_weights, user_w, engine, (void *)w), "weights memory");
    CHECK(onednn_make_reorder(&weight_reorder, user_w, w_md), "weights reorder");
    CHECK(onednn_run_reorder(weight_reorder, user_weights, op->weights), "weights reorder");
    if (bias != NULL) {
        const_dnnl_memory_desc_t bias_md = dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1);
        CHECK(dnnl.dnnl_memory_create(&op->bias, bias_md, engine, DNNL_MEMORY_ALLOCATE), "bias memory");
        CHECK(dnnl.dnnl_memory_create(&user_bias, b_md, engine, (void *)bias), "bias memory");
        CHECK(onednn_make_reorder(&bias_reorder, b_md, bias_md), "bias reorder");
        CHECK(onednn_run_reorder(bias_reorder, user_bias, op->bias), "bias reorder");
    }
    CHECK(dnnl.dnnl_stream_wait(stream), "weights reorder");
    status = 0;
fail:
    if (status != 0 && op != NULL)
        r->finished = -1; /* a half-made op: the region can only be destroyed */
    if (weight_reorder != NULL) dnnl.dnnl_primitive_destroy(weight_reorder);
    if (bias_reorder != NULL) dnnl.dnnl_primitive_destroy(bias_reorder);
    if (user_weights != NULL) dnnl.dnnl_memory_destroy(user_weights);
    if (user_bias != NULL) dnnl.dnnl_memory_destroy(user_bias);
    if (pd != NULL) dnnl.dnnl_primitive_desc_destroy(pd);
    if (attr != NULL) dnnl.dnnl_primitive_attr_destroy(attr);
    if (post != NULL) dnnl.dnnl_post_ops_destroy(post);
    dnnl_memory_desc_t mds[] = {any_src, any_dst, any_w, user_w, b_md};
    for (size_t i = 0; i < sizeof mds / sizeof mds[0]; ++i)
        if (mds[i] != NULL)
            dnnl.dnnl_memory_desc_destroy(mds[i]);
    return status;
}

/* dst takes src's shape and layout. */
static int same_as(onednn_region *r, int64_t src, int64_t dst)
{
    region_value *x = &r->values[src], *y = &r->values[dst];
    if (default_md(x) != 0)
        return -1;
    memcpy(y->dims, x->dims, sizeof y->dims);
    if (set_md(y, x->md) != 0)
        return -1;
    y->defined = 1;
    return 0;
}

int onednn_region_activation(onednn_region *r, int64_t src, int64_t dst, int act, float alpha,
                             float beta)
{
    if (!valid(r, src, 1) || !valid(r, dst, 0))
        return -1;
    if (act < ACT_NONE || act > ACT_HARD_SWISH) {
        snprintf(last_error, sizeof last_error, "unknown activation code %d", act);
        return -1;
    }
    region_op *op = add_op(r, OP_ACT);
    if (op == NULL)
        return -1;
    op->in[0] = src, op->n_in = 1, op->out = dst, op->act = act, op->alpha = alpha, op->beta = beta;
    return same_as(r, src, dst);
}

int onednn_region_add(onednn_region *r, int64_t a, int64_t b, int64_t dst)
{
    if (!valid(r, a, 1) || !valid(r, b, 1) || !valid(r, dst, 0))
        return -1;
    if (default_md(&r->values[a]) != 0 || default_md(&r->values[b]) != 0)
        return -1;
    if (!dnnl.dnnl_memory_desc_equal(r->values[a].md, r->values[b].md)) {
        snprintf(last_error, sizeof last_error, "Add of values in different shapes or layouts");
        return -1;
    }
    region_op *op = add_op(r, OP_ADD);
    if (op == NULL)
        return -1;
    op->in[0] = a, op->in[1] = b, op->n_in = 2, op->out = dst;
    return same_as(r, a, dst);
}

/* Along channels, inputs all nchw (per image, the inputs' bytes one after another) or all
 * NHWC (per pixel, the inputs' channels one after another). */
int onednn_region_concat(onednn_region *r, const int64_t *srcs, int64_t count, int64_t dst)
{
    if (count < 1 || count > MAX_CONCAT) {
        snprintf(last_error, sizeof last_error, "Concat of %lld values (1 to %d)", (long long)count, MAX_CONCAT);
        return -1;
    }
    for (int64_t i = 0; i < count; ++i)
        if (!valid(r, srcs[i], 1) || default_md(&r->values[srcs[i]]) != 0)
            return -1;
    if (!valid(r, dst, 0))
        return -1;
    const region_value *first = &r->values[srcs[0]];
    dnnl_format_tag_t tag = has_tag(first, dnnl_nchw) ? dnnl_nchw : dnnl_acdb;
    dnnl_dims_t dims = {first->dims[0], 0, first->dims[2], first->dims[3]};
    for (int64_t i = 0; i < count; ++i) {
        const region_value *v = &r->values[srcs[i]];
        if (!has_tag(v, tag) || v->dims[0] != dims[0] || v->dims[2] != dims[2]
            || v->dims[3] != dims[3]) {
            snprintf(last_error, sizeof last_error, "Concat input %lld is not in a layout the "
                     "region concatenates (all plain or all NHWC, equal batch and plane)", (long long)i);
            return -1;
        }
        dims[1] += v->dims[1];
    }
    region_op *op = add_op(r, OP_CONCAT);
    if (op == NULL)
        return -1;
    memcpy(op->in, srcs, (size_t)count * sizeof *srcs);
    op->n_in = count, op->out = dst;
    op->nhwc = tag == dnnl_acdb;
    region_value *y = &r->values[dst];
    memcpy(y->dims, dims, sizeof dims);
    dnnl_memory_desc_t md = NULL;
    if (tagged(&md, dims, tag) != dnnl_success) {
        snprintf(last_error, sizeof last_error, "oneDNN concat descriptor failed");
        return -1;
    }
    int status = set_md(y, md);
    dnnl.dnnl_memory_desc_destroy(md);
    y->defined = status == 0;
    return status;
}

/* geometry: k_h, k_w, stride_h, stride_w, pad_top, pad_left, out_h, out_w; no dilation. */
int onednn_region_pool(onednn_region *r, int64_t src, int64_t dst, int kind, const int64_t *geometry)
{
    if (!valid(r, src, 1) || !valid(r, dst, 0) || default_md(&r->values[src]) != 0)
        return -1;
    if (kind < REGION_MAX || kind > REGION_AVG_INCLUDE_PAD || !has_tag(&r->values[src], dnnl_acdb)) {
        snprintf(last_error, sizeof last_error, "pool kind %d over a value not in NHWC", kind);
        return -1;
    }
    for (int k = 0; k < 8; ++k)
        if (geometry[k] < (k >= 4 && k < 6 ? 0 : 1)) {
            snprintf(last_error, sizeof last_error, "bad pool geometry");
            return -1;
        }
    region_op *op = add_op(r, OP_POOL);
    if (op == NULL)
        return -1;
    op->in[0] = src, op->n_in = 1, op->out = dst, op->pool = kind;
    memcpy(op->geometry, geometry, sizeof op->geometry);
    region_value *y = &r->values[dst];
    dnnl_dims_t dims = {r->values[src].dims[0], r->values[src].dims[1], geometry[6], geometry[7]};
    memcpy(y->dims, dims, sizeof dims);
    dnnl_memory_desc_t md = NULL;
    if (tagged(&md, dims, dnnl_acdb) != dnnl_success) {
        snprintf(last_error, sizeof last_error, "oneDNN pool descriptor failed");
        return -1;
    }
    int status = set_md(y, md);
    dnnl.dnnl_memory_desc_destroy(md);
    y->defined = status == 0;
    return status;
}

/* The threads a region is planned for, before any op is added (its primitives split their
 * work for that many threads). */
int onednn_region_set_threads(onednn_region *r, int threads)
{
    if (r->n_ops != 0 || threads < 1 || threads > r->threads) {
        snprintf(last_error, sizeof last_error,
                 "threads are set before any op, between 1 and the configured %d", r->threads);
        return -1;
    }
    r->threads = threads;
    return 0;
}

/* single (the same ops, planned for one thread, finished) runs in r's place when the kernels
 * fall back to one thread; r owns it from here.  Weights laid out alike are r's, shared. */
int onednn_region_attach_single(onednn_region *r, onednn_region *single)
{
    if (r->finished != 1 || single->finished != 1 || r->single != NULL || single->single != NULL
        || single->threads != 1 || single->n_ops != r->n_ops) {
        snprintf(last_error, sizeof last_error, "a single-thread twin is a finished region of "
                 "the same ops planned for one thread, attached once");
        return -1;
    }
    for (int64_t i = 0; i < r->n_ops; ++i) {
        region_op *a = &r->ops[i], *b = &single->ops[i];
        if (a->kind != b->kind) {
            snprintf(last_error, sizeof last_error, "the twin's op %lld differs", (long long)i);
            return -1;
        }
        if (a->kind != OP_CONV)
            continue;
        const_dnnl_memory_desc_t ma = NULL, mb = NULL;
        if (dnnl.dnnl_memory_get_memory_desc(a->weights, &ma) == dnnl_success
            && dnnl.dnnl_memory_get_memory_desc(b->weights, &mb) == dnnl_success
            && dnnl.dnnl_memory_desc_equal(ma, mb)) {
            dnnl.dnnl_memory_destroy(b->weights);
            b->weights = a->weights, b->weights_borrowed = 1;
        }
    }
    r->single = single;
    return 0;
}

/* How often r's single-thread twin ran in its place, or -1 without one. */
long long onednn_region_single_runs(const onednn_region *r)
{
    return r->single != NULL ? __atomic_load_n(&r->single->runs, __ATOMIC_RELAXED) : -1;
}

int onednn_region_exit(onednn_region *r, int64_t value)
{
    if (!valid(r, value, 1))
        return -1;
    region_op *op = add_op(r, OP_EXIT);
    if (op == NULL)
        return -1;
    op->in[0] = value, op->n_in = 1, op->user = r->n_outputs++;
    return 0;
}

/* A free buffer of at least `bytes` (the smallest such; else the largest free one, grown), or
 * a new one. */
static int64_t take_buffer(onednn_region *r, char *is_free, size_t bytes)
{
    int64_t best = -1, largest = -1;
    for (int64_t b = 0; b < r->n_buffers; ++b) {
        if (!is_free[b])
            continue;
        if (r->buffer_bytes[b] >= bytes && (best < 0 || r->buffer_bytes[b] < r->buffer_bytes[best]))
            best = b;
        if (largest < 0 || r->buffer_bytes[b] > r->buffer_bytes[largest])
            largest = b;
    }
    if (best < 0 && largest >= 0)
        best = largest;
    if (best < 0) {
        best = r->n_buffers++;
        r->buffer_bytes[best] = 0;
    }
    if (r->buffer_bytes[best] < bytes)
        r->buffer_bytes[best] = bytes;
    is_free[best] = 0;
    return best;
}

/* The buffer op i writes in place of an input that dies there, or -1. */
static int64_t in_place(const onednn_region *r, const region_op *op, int64_t i)
{
    const region_value *v = r->values;
    switch (op->kind) {
    case OP_ACT:
        return v[op->in[0]].last_use == i ? v[op->in[0]].buffer : -1;
    case OP_CONV: /* not over a residual that is its source too: the convolution reads it */
        return op->n_in == 2 && op->in[1] != op->in[0] && v[op->in[1]].last_use == i
                   ? v[op->in[1]].buffer : -1;
    case OP_ADD:
        if (v[op->in[0]].last_use == i) return v[op->in[0]].buffer;
        return v[op->in[1]].last_use == i ? v[op->in[1]].buffer : -1;
    default:
        return -1;
    }
}

/* A convolution whose Relu output only an NHWC concat reads leaves the Relu to that concat,
 * which applies it as it copies (one pass over the values instead of two).  Ties are copied
 * before the Relu then, which gives the same values. */
static void defer_relu_to_concats(onednn_region *r)
{
    int64_t *readers = calloc((size_t)r->n_values, sizeof *readers);
    int64_t *producer = malloc((size_t)r->n_values * sizeof *producer);
    if (readers == NULL || producer == NULL) { /* the Relu then stays with its convolution */
        free(readers), free(producer);
        return;
    }
    for (int64_t v = 0; v < r->n_values; ++v)
        producer[v] = -1;
    for (int64_t i = 0; i < r->n_ops; ++i) {
        const region_op *op = &r->ops[i];
        for (int64_t k = 0; k < op->n_in; ++k)
            ++readers[op->in[k]];
        if (op->out >= 0)
            producer[op->out] = i;
    }
    for (int64_t i = 0; i < r->n_ops; ++i) {
        region_op *op = &r->ops[i];
        if (op->kind != OP_CONCAT || !op->nhwc)
            continue;
        for (int64_t k = 0; k < op->n_in; ++k) {
            int64_t p = producer[op->in[k]];
            region_op *conv = p >= 0 ? &r->ops[p] : NULL;
            if (conv != NULL && conv->kind == OP_CONV && conv->act == ACT_RELU
                && readers[op->in[k]] == 1)
                conv->relu_later = 1, op->relu_in[k] = 1;
        }
    }
    free(readers), free(producer);
}

int onednn_region_finish(onednn_region *r)
{
    if (r->finished != 0) {
        snprintf(last_error, sizeof last_error, "the region is finished or broken");
        return -1;
    }
    int status = -1;
    char *is_free = NULL;
    dnnl_memory_desc_t plain = NULL;
    for (int64_t i = 0; i < r->n_ops; ++i) {
        const region_op *op = &r->ops[i];
        for (int64_t k = 0; k < op->n_in; ++k) {
            r->values[op->in[k]].last_use = i;
        }
        if (op->out >= 0 && r->values[op->out].last_use < i)
            r->values[op->out].last_use = i;
    }
    defer_relu_to_concats(r);
    r->buffers = calloc((size_t)r->n_values + 1, sizeof *r->buffers);
    r->buffer_bytes = calloc((size_t)r->n_values + 1, sizeof *r->buffer_bytes);
    is_free = calloc((size_t)r->n_values + 1, 1);
    REQUIRE(r->buffers != NULL && r->buffer_bytes != NULL && is_free != NULL, "out of memory");
    for (int64_t i = 0; i < r->n_ops; ++i) {
        region_op *op = &r->ops[i];
        if (op->out >= 0) {
            region_value *y = &r->values[op->out];
            if (default_md(y) != 0)
                goto fail;
            int64_t b = in_place(r, op, i);
            if (b >= 0) {
                if (r->buffer_bytes[b] < y->bytes)
                    r->buffer_bytes[b] = y->bytes;
            } else {
                b = take_buffer(r, is_free, y->bytes);
                op->copy_residual = op->kind == OP_CONV && op->n_in == 2;
            }
            y->buffer = b;
        }
        for (int64_t k = 0; k < op->n_in; ++k) {
            const region_value *x = &r->values[op->in[k]];
            if (x->last_use == i && (op->out < 0 || x->buffer != r->values[op->out].buffer))
                is_free[x->buffer] = 1;
        }
        if (op->out >= 0 && r->values[op->out].last_use == i) /* made and never read */
            is_free[r->values[op->out].buffer] = 1;
    }
    for (int64_t b = 0; b < r->n_buffers; ++b) {
        size_t rounded = (r->buffer_bytes[b] + 4095) / 4096 * 4096;
        r->buffers[b] = aligned_alloc(4096, rounded ? rounded : 4096);
        REQUIRE(r->buffers[b] != NULL, "out of memory for the region's buffers");
        memset(r->buffers[b], 0, rounded); /* any layout oneDNN pads starts zero */
    }
    for (int64_t i = 0; i < r->n_ops; ++i) {
        region_op *op = &r->ops[i];
        if (op->kind != OP_ENTRY && op->kind != OP_EXIT)
            continue;
        region_value *v = &r->values[op->kind == OP_ENTRY ? op->out : op->in[0]];
        op->nhwc = has_tag(v, dnnl_acdb);
        if (op->nhwc)
            continue;
        CHECK(tagged(&plain, v->dims, dnnl_nchw), "plain descriptor");
        const_dnnl_memory_desc_t from = op->kind == OP_ENTRY ? plain : v->md;
        const_dnnl_memory_desc_t to = op->kind == OP_ENTRY ? v->md : plain;
        CHECK(onednn_make_reorder(&op->prim, from, to), "reorder");
        CHECK(dnnl.dnnl_memory_create(&op->from, from, engine, DNNL_MEMORY_NONE), "memory");
        CHECK(dnnl.dnnl_memory_create(&op->to, to, engine, DNNL_MEMORY_NONE), "memory");
        dnnl.dnnl_memory_desc_destroy(plain);
        plain = NULL;
    }
    r->finished = 1;
    status = 0;
    omp_set_num_threads(kernels_configured_threads()); /* a one-thread twin's planning set 1 */
fail:
    if (plain != NULL)
        dnnl.dnnl_memory_desc_destroy(plain);
    free(is_free);
    if (status != 0)
        r->finished = -1;
    return status;
}

static void *buffer_of(const onednn_region *r, int64_t v)
{
    return r->buffers[r->values[v].buffer];
}

/* Max (NaN kept) or average over windows of an NHWC value; a window's cells outside the
 * input are skipped (average: counted or not by kind).  Channels run 8 to a vector. */
#if defined(__x86_64__)
/* The first channels/8*8 channels of one output cell of pool_nhwc. */
AVX2 static void pool_cell_avx2(const float *image, int64_t in_w, int64_t channels, int64_t hs,
                                int64_t he, int64_t ws, int64_t we, int is_max, float count,
                                float *out)
{
    __m256 nan_value = _mm256_set1_ps(NAN), divisor = _mm256_set1_ps(count);
    for (int64_t c = 0; c + 8 <= channels; c += 8) {
        __m256 acc = _mm256_set1_ps(is_max ? -INFINITY : 0.0f), nan = _mm256_setzero_ps();
        for (int64_t h = hs; h < he; ++h) {
            const float *cell = image + (h * in_w + ws) * channels + c;
            for (int64_t w = ws; w < we; ++w, cell += channels) {
                __m256 v = _mm256_loadu_ps(cell);
                if (is_max) {
                    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                    acc = _mm256_max_ps(v, acc);
                } else {
                    acc = _mm256_add_ps(acc, v);
                }
            }
        }
        acc = is_max ? _mm256_blendv_ps(acc, nan_value, nan) : _mm256_div_ps(acc, divisor);
        _mm256_storeu_ps(out + c, acc);
    }
}
#endif

static void pool_nhwc(const region_op *op, const float *x, const int64_t *in_dims, float *y)
{
    const int64_t *g = op->geometry;
    int64_t batch = in_dims[0], channels = in_dims[1], in_h = in_dims[2], in_w = in_dims[3];
    int64_t out_h = g[6], out_w = g[7];
    int is_max = op->pool == REGION_MAX;
    int64_t vector_channels = 0;
#if defined(__x86_64__)
    int avx2 = have_avx2();
    if (avx2)
        vector_channels = channels / 8 * 8;
#endif
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < batch * out_h; ++p) {
        int64_t n = p / out_h, oh = p % out_h;
        const float *image = x + n * in_h * in_w * channels;
        float *row = y + (n * out_h + oh) * out_w * channels;
        int64_t h0 = oh * g[2] - g[4], h1 = h0 + g[0];
        int64_t hs = h0 < 0 ? 0 : h0, he = h1 > in_h ? in_h : h1;
        for (int64_t ow = 0; ow < out_w; ++ow) {
            int64_t w0 = ow * g[3] - g[5], w1 = w0 + g[1];
            int64_t ws = w0 < 0 ? 0 : w0, we = w1 > in_w ? in_w : w1;
            float count = op->pool == REGION_AVG_INCLUDE_PAD ? (float)(g[0] * g[1])
                                                             : (float)((he - hs) * (we - ws));
            float *out = row + ow * channels;
#if defined(__x86_64__)
            if (avx2)
                pool_cell_avx2(image, in_w, channels, hs, he, ws, we, is_max, count, out);
#endif
            for (int64_t c = vector_channels; c < channels; ++c) {
                float acc = is_max ? -INFINITY : 0.0f;
                int nan = 0;
                for (int64_t h = hs; h < he; ++h)
                    for (int64_t w = ws; w < we; ++w) {
                        float v = image[(h * in_w + w) * channels + c];
                        nan |= v != v;
                        acc = is_max ? (v > acc ? v : acc) : acc + v;
                    }
                out[c] = is_max ? (nan ? NAN : acc) : acc / count;
            }
        }
    }
}

/* Each channel c of y set to channel ties[c] (equal filters give equal channels, as the
 * reference's Conv makes them), y NHWC or nchw.  In NHWC the copies of a pixel go as runs
 * (tie_runs): a source broadcast over consecutive twins, or consecutive sources copied over
 * consecutive twins; a source channel is never a copy itself (ties[ties[c]] == ties[c]), so
 * runs never overlap their sources and their order is free. */
static void copy_tied_channels(float *y, const int64_t *dims, const int64_t *ties,
                               const int64_t *runs, int64_t n_runs, int nhwc)
{
    int64_t batch = dims[0], channels = dims[1], plane = dims[2] * dims[3];
    if (!nhwc) {
        for (int64_t n = 0; n < batch; ++n)
            for (int64_t c = 0; c < channels; ++c)
                if (ties[c] != c)
                    memcpy(y + (n * channels + c) * plane, y + (n * channels + ties[c]) * plane,
                           (size_t)plane * sizeof(float));
        return;
    }
#pragma omp parallel for schedule(static) if (batch * plane * channels > 32768)
    for (int64_t p = 0; p < batch * plane; ++p) {
        float *cell = y + p * channels;
        for (int64_t k = 0; k < n_runs; ++k) {
            const int64_t *run = runs + 4 * k; /* first twin, count, source, broadcast */
            float *to = cell + run[0];
            if (run[3]) {
                float v = cell[run[2]];
                for (int64_t i = 0; i < run[1]; ++i)
                    to[i] = v;
            } else {
                memcpy(to, cell + run[2], (size_t)run[1] * sizeof(float));
            }
        }
    }
}

/* ties as runs for copy_tied_channels, 4 words each (first twin, count, source, broadcast);
 * the number of runs, or -1 out of memory. */
static int64_t tie_runs(const int64_t *ties, int64_t channels, int64_t **runs)
{
    *runs = malloc((size_t)(channels + 1) * 4 * sizeof **runs);
    if (*runs == NULL)
        return -1;
    int64_t n = 0;
    for (int64_t c = 0; c < channels;) {
        if (ties[c] == c) {
            ++c;
            continue;
        }
        int64_t end = c + 1;
        int broadcast = end < channels && ties[end] == ties[c];
        while (end < channels && ties[end] != end
               && ties[end] == (broadcast ? ties[c] : ties[c] + (end - c)))
            ++end;
        int64_t *run = *runs + 4 * n++;
        run[0] = c, run[1] = end - c, run[2] = ties[c], run[3] = broadcast;
        c = end;
    }
    return n;
}

/* y = relu_f32(x) (NaN and -0.0 kept: x < 0 is false for them), 8 lanes at a time. */
#if defined(__x86_64__)
AVX2 static void relu_copy_avx2(const float *x, float *y, int64_t n)
{
    __m256 zero = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 v = _mm256_loadu_ps(x + j);
        _mm256_storeu_ps(y + j, _mm256_andnot_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ), v));
    }
    for (; j < n; ++j)
        y[j] = x[j] < 0.0f ? 0.0f : x[j];
}
#endif

static void relu_copy(const float *x, float *y, int64_t n, int avx2)
{
#if defined(__x86_64__)
    if (avx2) {
        relu_copy_avx2(x, y, n);
        return;
    }
#endif
    (void)avx2;
    for (int64_t j = 0; j < n; ++j)
        y[j] = x[j] < 0.0f ? 0.0f : x[j];
}

/* Per pixel, each input's channels one after another (NHWC inputs, NHWC y of all channels). */
static void concat_nhwc(const onednn_region *r, const region_op *op, float *y)
{
    const region_value *out = &r->values[op->out];
    int64_t pixels = out->dims[0] * out->dims[2] * out->dims[3], channels = out->dims[1];
#if defined(__x86_64__)
    int avx2 = have_avx2();
#else
    int avx2 = 0;
#endif
#pragma omp parallel for schedule(static) if (pixels * channels > 32768)
    for (int64_t p = 0; p < pixels; ++p) {
        float *cell = y + p * channels;
        for (int64_t k = 0; k < op->n_in; ++k) {
            const region_value *x = &r->values[op->in[k]];
            int64_t c = x->dims[1];
            const float *from = (const float *)r->buffers[x->buffer] + p * c;
            if (op->relu_in[k])
                relu_copy(from, cell, c, avx2);
            else
                memcpy(cell, from, (size_t)c * sizeof(float));
            cell += c;
        }
    }
}

static void add_f32(const float *a, const float *b, float *y, size_t n)
{
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; ++i)
        y[i] = a[i] + b[i];
}

static int run_locked(onednn_region *r, const float *const *inputs, float *const *outputs)
{
    for (int64_t i = 0; i < r->n_ops; ++i) {
        region_op *op = &r->ops[i];
        region_value *y = op->out >= 0 ? &r->values[op->out] : NULL;
        switch (op->kind) {
        case OP_ENTRY:
            if (op->nhwc) {
                const int64_t *d = r->values[op->out].dims;
                if (dnnl.dnnl_stream_wait(stream) != dnnl_success) return -1;
                onednn_nchw_to_nhwc(inputs[op->user], buffer_of(r, op->out), d[0], d[1],
                                    d[2] * d[3], r->threads);
                break;
            }
            dnnl.dnnl_memory_set_data_handle(op->from, (void *)inputs[op->user]);
            dnnl.dnnl_memory_set_data_handle(op->to, buffer_of(r, op->out));
            if (onednn_run_reorder(op->prim, op->from, op->to) != dnnl_success) return -1;
            break;
        case OP_EXIT:
            if (op->nhwc) {
                const int64_t *d = r->values[op->in[0]].dims;
                if (dnnl.dnnl_stream_wait(stream) != dnnl_success) return -1;
                onednn_nhwc_to_nchw(buffer_of(r, op->in[0]), outputs[op->user], d[0], d[1],
                                    d[2] * d[3], r->threads);
                break;
            }
            dnnl.dnnl_memory_set_data_handle(op->from, buffer_of(r, op->in[0]));
            dnnl.dnnl_memory_set_data_handle(op->to, outputs[op->user]);
            if (onednn_run_reorder(op->prim, op->from, op->to) != dnnl_success) return -1;
            break;
        case OP_CONV: {
            if (op->copy_residual)
                memcpy(buffer_of(r, op->out), buffer_of(r, op->in[1]), y->bytes);
            dnnl.dnnl_memory_set_data_handle(op->from, buffer_of(r, op->in[0]));
            dnnl.dnnl_memory_set_data_handle(op->to, buffer_of(r, op->out));
            dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, op->from}, {DNNL_ARG_WEIGHTS, op->weights},
                                       {DNNL_ARG_DST, op->to}, {DNNL_ARG_BIAS, op->bias}};
            if (dnnl.dnnl_primitive_execute(op->prim, stream, op->bias != NULL ? 4 : 3, args) != dnnl_success)
                return -1;
            if (op->act != ACT_NONE && !op->relu_later) {
                if (dnnl.dnnl_stream_wait(stream) != dnnl_success) return -1;
                activation_f32(buffer_of(r, op->out), buffer_of(r, op->out), y->bytes / sizeof(float),
                               op->act, op->alpha, op->beta);
            }
            if (op->ties != NULL) {
                if (dnnl.dnnl_stream_wait(stream) != dnnl_success) return -1;
                copy_tied_channels(buffer_of(r, op->out), y->dims, op->ties, op->tie_runs,
                                   op->n_tie_runs, op->ties_nhwc);
            }
            break;
        }
        case OP_ACT:
            if (dnnl.dnnl_stream_wait(stream) != dnnl_success) return -1;
            activation_f32(buffer_of(r, op->in[0]), buffer_of(r, op->out), y->bytes / sizeof(float),
                           op->act, op->alpha, op->beta);
            break;
        case OP_ADD:
            if (dnnl.dnnl_stream_wait(stream) != dnnl_success) return -1;
            add_f32(buffer_of(r, op->in[0]), buffer_of(r, op->in[1]), buffer_of(r, op->out),
                    y->bytes / sizeof(float));
            break;
        case OP_CONCAT: {
            if (dnnl.dnnl_stream_wait(stream) != dnnl_success) return -1;
            if (op->nhwc) {
                concat_nhwc(r, op, buffer_of(r, op->out));
                break;
            }
            char *out = buffer_of(r, op->out);
            size_t image = y->bytes / (size_t)y->dims[0], at = 0;
            for (int64_t k = 0; k < op->n_in; ++k) {
                const region_value *x = &r->values[op->in[k]];
                size_t part = x->bytes / (size_t)x->dims[0];
                const char *in = buffer_of(r, op->in[k]);
                for (int64_t n = 0; n < y->dims[0]; ++n)
                    memcpy(out + (size_t)n * image + at, in + (size_t)n * part, part);
                at += part;
            }
            break;
        }
        case OP_POOL:
            if (dnnl.dnnl_stream_wait(stream) != dnnl_success) return -1;
            pool_nhwc(op, buffer_of(r, op->in[0]), r->values[op->in[0]].dims, buffer_of(r, op->out));
            break;
        default:
            return -1;
        }
    }
    return dnnl.dnnl_stream_wait(stream) == dnnl_success ? 0 : -1;
}

/* inputs in entry order, outputs in exit order, all NCHW float32. */
int onednn_region_run(onednn_region *r, const float *const *inputs, float *const *outputs)
{
    if (r->finished != 1) {
        snprintf(last_error, sizeof last_error, "the region is not finished");
        return -1;
    }
    if (r->single != NULL && kernels_get_num_threads() < r->threads)
        return onednn_region_run(r->single, inputs, outputs);
    pthread_mutex_lock(&r->lock);
    omp_set_num_threads(r->threads);
    ++r->runs;
    int status = run_locked(r, inputs, outputs);
    pthread_mutex_unlock(&r->lock);
    return status;
}

/* As onednn_region_run with its inputs then outputs named by slot (slot_ids). */
int onednn_region_run_slots(onednn_region *r, void *const *slots, const int32_t *slot_ids)
{
    const float *inputs[64];
    float *outputs[64];
    if (r->n_inputs > 64 || r->n_outputs > 64)
        return -1;
    for (int64_t k = 0; k < r->n_inputs; ++k)
        inputs[k] = slots[slot_ids[k]];
    for (int64_t k = 0; k < r->n_outputs; ++k)
        outputs[k] = slots[slot_ids[r->n_inputs + k]];
    return onednn_region_run(r, inputs, outputs);
}

void onednn_region_destroy(onednn_region *r)
{
    if (r == NULL)
        return;
    onednn_region_destroy(r->single);
    for (int64_t i = 0; i < r->n_ops; ++i) {
        region_op *op = &r->ops[i];
        if (op->prim != NULL) dnnl.dnnl_primitive_destroy(op->prim);
        free(op->ties);
        free(op->tie_runs);
        dnnl_memory_t mems[] = {op->from, op->to, op->weights_borrowed ? NULL : op->weights, op->bias};
        for (size_t k = 0; k < sizeof mems / sizeof mems[0]; ++k)
            if (mems[k] != NULL)
                dnnl.dnnl_memory_destroy(mems[k]);
    }
    for (int64_t v = 0; v < r->n_values; ++v)
        if (r->values[v].md != NULL)
            dnnl.dnnl_memory_desc_destroy(r->values[v].md);
    if (r->buffers != NULL)
        for (int64_t b = 0; b < r->n_buffers; ++b)
            free(r->buffers[b]);
    free(r->buffers);
    free(r->buffer_bytes);
    free(r->values);
    free(r->ops);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

#endif
