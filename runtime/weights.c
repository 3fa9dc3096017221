/* Weights: checked against the config, packed once into the GEMM kernels'
 * panel layout from wherever they are (weight_source.h): the caller's float32
 * or 16-bit tensors, a safetensors file, or the seeded synthetic weights. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "big_alloc.h"
#include "error.h"
#include "gemm_pack.h"
#include "weights.h"
#include "threads.h"
#include "sneppx/safetensors.h"

sneppx_status sneppx_pack_gemm(sneppx_layer *layer, struct sneppx_packed_gemm *gemm, int64_t instances,
                               int has_bias)
{
    gemm->panel_bytes = gemm->bf16_pairs ? sneppx_gemm_packed_pair_bytes(gemm->k, gemm->n, layer->target->gemm_nr)
                                         : sneppx_gemm_packed_bytes(gemm->k, gemm->n, layer->target->gemm_nr,
                                                                    gemm->weight_type);
    gemm->threads = sneppx_thread_count(layer);
    gemm->instances = instances;
    gemm->panels = sneppx_alloc_big((size_t)(gemm->panel_bytes * instances));
    if (!gemm->panels)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "weights: cannot allocate %lld packed bytes for %s",
                           (long long)(gemm->panel_bytes * instances), gemm->kernel->key);
    if (has_bias) {
        gemm->bias = calloc((size_t)gemm->n, sizeof(float));
        if (!gemm->bias)
            return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "weights: cannot allocate bias for %s", gemm->kernel->key);
    }
    return SNEPPX_OK;
}

/* The first failure of a pack loop's tasks: status and message, recorded on
 * the worker thread that met it (last errors are per thread) and raised again
 * on the caller's. */
struct pack_failure {
    atomic_int failed;
    sneppx_status status;
    char message[512];
};

static void record_failure(struct pack_failure *failure, sneppx_status status)
{
    int none = 0; /* the first task to fail writes; the others are read after the loop's barrier */
    if (atomic_compare_exchange_strong(&failure->failed, &none, 1)) {
        failure->status = status;
        snprintf(failure->message, sizeof failure->message, "%s", sneppx_last_error());
    }
}

/* The pack entry indexes src by absolute output column (src + c * stride).
 * Rows [first, ...) of a buffer starting at base therefore go in as base moved
 * back by first rows, computed in integers: only the kernel's own indexing
 * brings the address back into the buffer. */
static const float *rebased(const float *base, int64_t first, int64_t stride)
{
    return (const float *)((uintptr_t)base - (uintptr_t)(first * stride) * sizeof(float));
}

/* Rows [c0, c1) of the stacked parts (part 0's rows, then part 1's, ...) as
 * float32 into scratch, row-major. */
static sneppx_status gather_rows(const struct sneppx_weight_source *const parts[], int part_count, int64_t c0,
                                 int64_t c1, int64_t k, float *scratch)
{
    int64_t part_begin = 0;
    for (int p = 0; p < part_count && part_begin < c1; part_begin += parts[p]->rows, p++) {
        const int64_t begin = c0 > part_begin ? c0 : part_begin;
        const int64_t end = c1 < part_begin + parts[p]->rows ? c1 : part_begin + parts[p]->rows;
        if (begin >= end)
            continue;
        sneppx_status status =
            sneppx_weight_source_read(parts[p], begin - part_begin, end - begin, scratch + (begin - c0) * k);
        if (status != SNEPPX_OK)
            return status;
    }
    return SNEPPX_OK;
}

sneppx_status sneppx_pack_gemm_sources(struct sneppx_packed_gemm *gemm, int64_t instance,
                                       const struct sneppx_weight_source *const parts[], int part_count)
{
    const int64_t k = gemm->k, tasks = (gemm->n + SNEPPX_PACK_COLUMNS - 1) / SNEPPX_PACK_COLUMNS;
    float *dst = (float *)((char *)gemm->panels + instance * gemm->panel_bytes);
    struct pack_failure failure = {.status = SNEPPX_OK};
#pragma omp parallel num_threads(gemm->threads)
    {
        float *scratch = NULL; /* this thread's SNEPPX_PACK_COLUMNS rows of float32, made on first need */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            if (atomic_load(&failure.failed))
                continue;
            const int64_t c0 = task * SNEPPX_PACK_COLUMNS;
            const int64_t c1 = c0 + SNEPPX_PACK_COLUMNS < gemm->n ? c0 + SNEPPX_PACK_COLUMNS : gemm->n;
            int64_t part_begin = 0;
            int p = 0;
            while (p + 1 < part_count && c0 >= part_begin + parts[p]->rows)
                part_begin += parts[p++]->rows;
            const struct sneppx_weight_source *part = parts[p];
            const float *src;
            if (part->kind == SNEPPX_SOURCE_MEMORY && part->dtype == SNEPPX_DTYPE_FLOAT32 &&
                sneppx_weight_source_rows_contiguous(part) && c1 <= part_begin + part->rows) {
                /* float32 rows in memory: packed in place (a shard's from its first row) */
                src = rebased((const float *)part->data + part->row0 * k, part_begin, k);
            } else {
                if (!scratch && !(scratch = malloc(sizeof(float) * (size_t)(SNEPPX_PACK_COLUMNS * k)))) {
                    record_failure(&failure, sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY,
                                                         "weights: no memory for a %lld-float pack buffer (%s)",
                                                         (long long)(SNEPPX_PACK_COLUMNS * k), gemm->kernel->key));
                    continue;
                }
                sneppx_status status = gather_rows(parts, part_count, c0, c1, k, scratch);
                if (status != SNEPPX_OK) {
                    record_failure(&failure, status);
                    continue;
                }
                src = rebased(scratch, c0, k);
            }
            sneppx_gemm_pack_columns(gemm->kernel, src, k, c0, c1, dst);
        }
        free(scratch);
    }
    if (atomic_load(&failure.failed))
        return sneppx_fail(failure.status, "%s", failure.message);
    return SNEPPX_OK;
}

void sneppx_pack_gemm_instance(struct sneppx_packed_gemm *gemm, int64_t instance, const float *hf_weight)
{
    /* float32 rows in memory are packed in place: nothing here can fail */
    const struct sneppx_weight_source source = sneppx_float32_source(hf_weight, gemm->n, gemm->k);
    const struct sneppx_weight_source *parts[1] = {&source};
    (void)sneppx_pack_gemm_sources(gemm, instance, parts, 1);
}

/* ---- loading ------------------------------------------------------------ */

/* Widens a rank-1 source (bias, norm weight) into n floats. */
static sneppx_status read_vector(const struct sneppx_weight_source *source, float *out)
{
    return sneppx_weight_source_read(source, 0, source->rows, out);
}

/* Packs the stacked parts (rows n in all, cols k each) into gemm, and their biases
 * (rank-1 sources, or NONE) into its bias. */
static sneppx_status pack_stacked(sneppx_layer *layer, struct sneppx_packed_gemm *gemm,
                                  const struct sneppx_weight_source *const parts[],
                                  const struct sneppx_weight_source *const biases[], int count)
{
    const int has_bias = biases && biases[0]->kind != SNEPPX_SOURCE_NONE;
    sneppx_status status = sneppx_pack_gemm(layer, gemm, 1, has_bias);
    if (status != SNEPPX_OK || (status = sneppx_pack_gemm_sources(gemm, 0, parts, count)) != SNEPPX_OK)
        return status;
    int64_t offset = 0;
    for (int i = 0; has_bias && i < count && status == SNEPPX_OK; offset += parts[i]->rows, i++)
        status = sneppx_weight_source_read(biases[i], 0, biases[i]->rows, gemm->bias + offset);
    return status;
}

static sneppx_status pack_projection(sneppx_layer *layer, struct sneppx_packed_gemm *gemm,
                                     const struct sneppx_weight_source *weight, const struct sneppx_weight_source *bias)
{
    const struct sneppx_weight_source *parts[1] = {weight};
    const struct sneppx_weight_source *biases[1] = {bias};
    return pack_stacked(layer, gemm, parts, bias ? biases : NULL, 1);
}

#define SOURCE(field) (&sources[offsetof(sneppx_weights, field) / sizeof(const float *)])

static sneppx_status load_standard(sneppx_layer *layer, const struct sneppx_weight_source *sources)
{
    /* q|k|v stacked into one [qkv_dim, hidden] operand: one GEMM reads x once.
     * Each pack task reads its rows from whichever tensor holds them. */
    const struct sneppx_weight_source *parts[3] = {SOURCE(q_proj_weight), SOURCE(k_proj_weight),
                                                   SOURCE(v_proj_weight)};
    const struct sneppx_weight_source *biases[3] = {SOURCE(q_proj_bias), SOURCE(k_proj_bias), SOURCE(v_proj_bias)};
    sneppx_status status = pack_stacked(layer, &layer->qkv_proj, parts, biases, 3);
    if (status != SNEPPX_OK)
        return status;
    return pack_projection(layer, &layer->o_proj, SOURCE(o_proj_weight), SOURCE(o_proj_bias));
}

static sneppx_status copy_vector(const struct sneppx_weight_source *source, float **out, const char *what)
{
    if (!(*out = malloc(sizeof(float) * (size_t)source->rows)))
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "weights: %s", what);
    return read_vector(source, *out);
}

/* Absorption, once at load: per head, q_lat = q_nope W_UK needs W_UK^T as the
 * [out=rank, in=nope] operand; o = o_lat W_UV^T uses W_UV [vdim, rank] as is.
 * Both are float32 here (kv_b_proj widened whole); packing rounds them to the
 * weight type. */
static sneppx_status absorb_kv_b(sneppx_layer *layer, const struct sneppx_weight_source *kv_b)
{
    const sneppx_config *c = &layer->config;
    const int64_t heads = c->num_attention_heads, nope = c->qk_nope_head_dim, vdim = c->v_head_dim;
    const int64_t rank = c->kv_lora_rank, per_head = nope + vdim;
    sneppx_status status;
    if ((status = sneppx_pack_gemm(layer, &layer->absorb_uk, heads, 0)) != SNEPPX_OK ||
        (status = sneppx_pack_gemm(layer, &layer->absorb_uv, heads, 0)) != SNEPPX_OK)
        return status;
    float *kv_b_proj = malloc(sizeof(float) * (size_t)(kv_b->rows * kv_b->cols));
    float *uk_transposed = malloc(sizeof(float) * (size_t)(rank * nope));
    if (!kv_b_proj || !uk_transposed)
        status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "weights: kv_b_proj absorption");
    else
        status = sneppx_weight_source_read(kv_b, 0, kv_b->rows, kv_b_proj);
    for (int64_t h = 0; h < heads && status == SNEPPX_OK; h++) {
        const float *w_uk = kv_b_proj + h * per_head * rank;          /* [nope, rank] */
        const float *w_uv = kv_b_proj + (h * per_head + nope) * rank; /* [vdim, rank] */
        for (int64_t d = 0; d < nope; d++)
            for (int64_t r = 0; r < rank; r++)
                uk_transposed[r * nope + d] = w_uk[d * rank + r];
        sneppx_pack_gemm_instance(&layer->absorb_uk, h, uk_transposed);
        sneppx_pack_gemm_instance(&layer->absorb_uv, h, w_uv);
    }
    free(uk_transposed);
    free(kv_b_proj);
    return status;
}

static sneppx_status load_mla(sneppx_layer *layer, const struct sneppx_weight_source *sources)
{
    const sneppx_config *c = &layer->config;
    sneppx_status status;
    if (c->q_lora_rank > 0) {
        if ((status = pack_projection(layer, &layer->q_a_proj, SOURCE(q_a_proj_weight), SOURCE(q_a_proj_bias))) !=
                SNEPPX_OK ||
            (status = pack_projection(layer, &layer->qkv_proj, SOURCE(q_b_proj_weight), NULL)) != SNEPPX_OK ||
            (status = copy_vector(SOURCE(q_a_layernorm_weight), &layer->q_a_norm_weight, "q_a_layernorm")) !=
                SNEPPX_OK)
            return status;
    } else if ((status = pack_projection(layer, &layer->qkv_proj, SOURCE(q_proj_weight), NULL)) != SNEPPX_OK) {
        return status;
    }
    if ((status = pack_projection(layer, &layer->kv_a_proj, SOURCE(kv_a_proj_with_mqa_weight),
                                  SOURCE(kv_a_proj_with_mqa_bias))) != SNEPPX_OK ||
        (status = copy_vector(SOURCE(kv_a_layernorm_weight), &layer->kv_a_norm_weight, "kv_a_layernorm")) !=
            SNEPPX_OK)
        return status;
    if (c->mla_naive)
        status = pack_projection(layer, &layer->kv_b_proj, SOURCE(kv_b_proj_weight), NULL);
    else
        status = absorb_kv_b(layer, SOURCE(kv_b_proj_weight));
    if (status != SNEPPX_OK)
        return status;
    return pack_projection(layer, &layer->o_proj, SOURCE(o_proj_weight), SOURCE(o_proj_bias));
}

sneppx_status sneppx_weight_sources_check(const sneppx_config *config,
                                          struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS])
{
    /* The one table of what a config's layer holds (shared with the checkpoint loader). */
    sneppx_attn_tensor tensors[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    sneppx_status status = sneppx_attn_tensors(config, tensors, &count);
    if (status != SNEPPX_OK)
        return status;
    /* Every tensor the config needs must be given, and no other. */
    int needed[SNEPPX_WEIGHT_FIELDS] = {0};
    for (int i = 0; i < count; i++) {
        const int field = (int)(tensors[i].weights_offset / sizeof(const float *));
        needed[field] = 1;
        if (sources[field].kind == SNEPPX_SOURCE_NONE)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "weights.%s: NULL, but this config needs %s [%lld x %lld]",
                               sneppx_weight_field_names[field], tensors[i].name, (long long)tensors[i].shape[0],
                               (long long)(tensors[i].rank == 2 ? tensors[i].shape[1] : 1));
        sources[field].rows = tensors[i].shape[0];
        sources[field].cols = tensors[i].rank == 2 ? tensors[i].shape[1] : 1;
    }
    for (int field = 0; field < SNEPPX_WEIGHT_FIELDS; field++)
        if (sources[field].kind != SNEPPX_SOURCE_NONE && !needed[field])
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "weights.%s: given, but this config has no such tensor",
                               sneppx_weight_field_names[field]);
    return SNEPPX_OK;
}

sneppx_status sneppx_layer_load_sources(sneppx_layer *layer, struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS])
{
    sneppx_status status = sneppx_weight_sources_check(&layer->config, sources);
    if (status != SNEPPX_OK)
        return status;
    return layer->is_mla ? load_mla(layer, sources) : load_standard(layer, sources);
}

sneppx_status sneppx_synthetic_sources(const sneppx_config *config,
                                      struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS])
{
    sneppx_attn_tensor tensors[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    sneppx_status status = sneppx_attn_tensors(config, tensors, &count);
    for (int i = 0; i < count && status == SNEPPX_OK; i++) {
        const sneppx_attn_tensor *tensor = &tensors[i];
        const int field = (int)(tensor->weights_offset / sizeof(const float *));
        const int is_norm = strstr(tensor->name, "layernorm") != NULL;
        struct sneppx_weight_source *source = &sources[field];
        source->kind = SNEPPX_SOURCE_SYNTHETIC;
        source->tensor_id = field;
        source->scale = tensor->rank == 2 ? (float)(1.0 / sqrt((double)tensor->shape[1])) : 0.1f;
        source->offset = is_norm ? 1.0f : 0.0f;
    }
    return status;
}

void sneppx_float32_sources(const sneppx_weights *weights, struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS])
{
    const float *const *given = (const float *const *)weights;
    for (int field = 0; field < SNEPPX_WEIGHT_FIELDS; field++)
        if (given[field])
            sources[field] = sneppx_float32_source(given[field], 0, 0); /* shapes: from the config */
}

sneppx_status sneppx_layer_create_from_sources(const sneppx_config *config,
                                               struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS],
                                               sneppx_layer **out)
{
    /* Weights are checked before any kernel compiles. */
    sneppx_status status = sneppx_weight_sources_check(config, sources);
    sneppx_layer *layer = NULL;
    if (status == SNEPPX_OK)
        status = sneppx_layer_create_unpacked(config, &layer);
    if (status == SNEPPX_OK)
        status = sneppx_layer_load_sources(layer, sources);
    if (status != SNEPPX_OK) {
        sneppx_layer_destroy(layer);
        return status;
    }
    *out = layer;
    return SNEPPX_OK;
}

sneppx_status sneppx_layer_create_typed(const sneppx_config *config, const sneppx_typed_weights *weights,
                                        sneppx_layer **out)
{
    sneppx_clear_error();
    if (!out)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: output pointer must not be NULL");
    *out = NULL;
    if (!config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS] = {{0}};
    const sneppx_status status = sneppx_typed_sources(weights, sources);
    if (status != SNEPPX_OK)
        return status;
    return sneppx_layer_create_from_sources(config, sources, out);
}

sneppx_status sneppx_typed_sources(const sneppx_typed_weights *weights,
                                   struct sneppx_weight_source sources[SNEPPX_WEIGHT_FIELDS])
{
    if (!weights)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "weights: must not be NULL (sneppx_layer_create with NULL gives synthetic weights)");
    const sneppx_tensor_ref *refs = (const sneppx_tensor_ref *)weights;
    for (int field = 0; field < SNEPPX_WEIGHT_FIELDS; field++) {
        if (!refs[field].data)
            continue;
        const int dtype = (int)refs[field].dtype;
        if (!sneppx_source_dtype_supported(dtype)) {
            const char *name = sneppx_dtype_name(dtype);
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                               "weights.%s.dtype: %d%s%s%s is not a type tensors are read in (float32, bfloat16, "
                               "float16)",
                               sneppx_weight_field_names[field], dtype, name ? " (" : "", name ? name : "",
                               name ? ")" : "");
        }
        if (dtype != SNEPPX_DTYPE_FLOAT32 && ((uintptr_t)refs[field].data & 1))
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "weights.%s.data: %s elements at an odd address",
                               sneppx_weight_field_names[field], sneppx_dtype_name(dtype));
        sources[field].kind = SNEPPX_SOURCE_MEMORY;
        sources[field].data = refs[field].data;
        sources[field].dtype = (sneppx_dtype)dtype;
    }
    return SNEPPX_OK;
}
