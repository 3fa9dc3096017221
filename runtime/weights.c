/* Weights: checked against the config, packed once into the GEMM kernels'
 * panel layout; deterministic synthetic weights when none are given. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "big_alloc.h"
#include "error.h"
#include "weights.h"
#include "threads.h"
#include "sneppx/safetensors.h"

sneppx_status sneppx_pack_gemm(sneppx_layer *layer, struct sneppx_packed_gemm *gemm, int64_t instances,
                               int has_bias)
{
    gemm->panel_bytes = gemm->bf16_pairs ? sneppx_gemm_packed_pair_bytes(gemm->k, gemm->n, layer->target->gemm_nr)
                                         : sneppx_gemm_packed_bytes(gemm->k, gemm->n, layer->target->gemm_nr,
                                                                    gemm->element_bytes);
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

void sneppx_pack_gemm_instance(struct sneppx_packed_gemm *gemm, int64_t instance, const float *hf_weight,
                               int64_t hf_row_stride)
{
    const int64_t panel_columns = 64; /* columns per pack task: a multiple of every NR */
    const int64_t tasks = (gemm->n + panel_columns - 1) / panel_columns;
    /* The _pack entry rounds the float32 rows to the key's weight type. */
    float *dst = (float *)((char *)gemm->panels + instance * gemm->panel_bytes);
#pragma omp parallel for schedule(static) num_threads(gemm->threads)
    for (int64_t task = 0; task < tasks; task++) {
        struct sneppx_args args = {0};
        args.struct_size = sizeof args;
        args.abi_version = SNEPPX_ABI_VERSION;
        args.col_begin = task * panel_columns;
        args.col_end = args.col_begin + panel_columns < gemm->n ? args.col_begin + panel_columns : gemm->n;
        args.src = hf_weight;
        args.src_stride = hf_row_stride;
        args.dst = dst;
        gemm->kernel->entry[SNEPPX_ENTRY_PACK](&args);
    }
}

/* ---- synthetic weights ------------------------------------------------- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Tensor ids are the field order of sneppx_weights; elements are counter-based,
 * so the values do not depend on the thread count. */
static float *synthetic_tensor(int tensor_id, int64_t count, float scale, float offset, int threads)
{
    float *tensor = malloc(sizeof(float) * (size_t)count);
    if (!tensor)
        return NULL;
    const uint64_t stream = splitmix64(SNEPPX_SYNTHETIC_SEED + (uint64_t)tensor_id);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < count; i++) {
        const double unit = (double)(splitmix64(stream ^ (uint64_t)i) >> 11) * 0x1.0p-53; /* [0, 1) */
        tensor[i] = offset + scale * (float)(2.0 * unit - 1.0);
    }
    return tensor;
}

/* The weight pointer a tensor fills, and its synthetic-tensor id (the field's
 * index in sneppx_weights, as layer.h documents). */
static const float **weight_slot(sneppx_weights *weights, const sneppx_attn_tensor *tensor)
{
    return (const float **)((char *)weights + tensor->weights_offset);
}

static int tensor_id(const sneppx_attn_tensor *tensor)
{
    return (int)(tensor->weights_offset / sizeof(const float *));
}

static sneppx_status pack_projection(sneppx_layer *layer, struct sneppx_packed_gemm *gemm, const float *weight,
                                     const float *bias)
{
    sneppx_status status = sneppx_pack_gemm(layer, gemm, 1, bias != NULL);
    if (status != SNEPPX_OK)
        return status;
    sneppx_pack_gemm_instance(gemm, 0, weight, gemm->k);
    if (bias)
        memcpy(gemm->bias, bias, sizeof(float) * (size_t)gemm->n);
    return SNEPPX_OK;
}

static sneppx_status load_standard(sneppx_layer *layer, const sneppx_weights *w)
{
    const int64_t hidden = layer->config.hidden_size;
    /* Fuse q|k|v into one [qkv_dim, hidden] matrix: one GEMM reads x once. */
    float *fused = sneppx_alloc_floats((size_t)(layer->qkv_dim * hidden));
    float *fused_bias = layer->config.qkv_bias ? malloc(sizeof(float) * (size_t)layer->qkv_dim) : NULL;
    if (!fused || (layer->config.qkv_bias && !fused_bias)) {
        free(fused);
        free(fused_bias);
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "weights: cannot allocate the fused QKV matrix");
    }
    const float *parts[3] = {w->q_proj_weight, w->k_proj_weight, w->v_proj_weight};
    const float *biases[3] = {w->q_proj_bias, w->k_proj_bias, w->v_proj_bias};
    const int64_t rows[3] = {layer->q_dim, layer->kv_dim, layer->kv_dim};
    int64_t offset = 0;
    for (int i = 0; i < 3; i++) {
        memcpy(fused + offset * hidden, parts[i], sizeof(float) * (size_t)(rows[i] * hidden));
        if (fused_bias)
            memcpy(fused_bias + offset, biases[i], sizeof(float) * (size_t)rows[i]);
        offset += rows[i];
    }
    sneppx_status status = pack_projection(layer, &layer->qkv_proj, fused, fused_bias);
    free(fused);
    free(fused_bias);
    if (status != SNEPPX_OK)
        return status;
    return pack_projection(layer, &layer->o_proj, w->o_proj_weight, w->o_proj_bias);
}

static float *copy_vector(const float *src, int64_t n)
{
    float *copy = malloc(sizeof(float) * (size_t)n);
    if (copy)
        memcpy(copy, src, sizeof(float) * (size_t)n);
    return copy;
}

static sneppx_status load_mla(sneppx_layer *layer, const sneppx_weights *w)
{
    const sneppx_config *c = &layer->config;
    const int64_t heads = c->num_attention_heads, nope = c->qk_nope_head_dim, vdim = c->v_head_dim;
    const int64_t rank = c->kv_lora_rank, per_head = nope + vdim;
    sneppx_status status;
    if (c->q_lora_rank > 0) {
        if ((status = pack_projection(layer, &layer->q_a_proj, w->q_a_proj_weight, w->q_a_proj_bias)) != SNEPPX_OK ||
            (status = pack_projection(layer, &layer->qkv_proj, w->q_b_proj_weight, NULL)) != SNEPPX_OK)
            return status;
        if (!(layer->q_a_norm_weight = copy_vector(w->q_a_layernorm_weight, c->q_lora_rank)))
            return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "weights: q_a_layernorm");
    } else if ((status = pack_projection(layer, &layer->qkv_proj, w->q_proj_weight, NULL)) != SNEPPX_OK) {
        return status;
    }
    if ((status = pack_projection(layer, &layer->kv_a_proj, w->kv_a_proj_with_mqa_weight,
                                  w->kv_a_proj_with_mqa_bias)) != SNEPPX_OK)
        return status;
    if (!(layer->kv_a_norm_weight = copy_vector(w->kv_a_layernorm_weight, rank)))
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "weights: kv_a_layernorm");
    if (c->mla_naive) {
        if ((status = pack_projection(layer, &layer->kv_b_proj, w->kv_b_proj_weight, NULL)) != SNEPPX_OK)
            return status;
    } else {
        /* Absorption, once at load: per head, q_lat = q_nope W_UK needs W_UK^T as
         * the [out=rank, in=nope] operand; o = o_lat W_UV^T uses W_UV [vdim, rank] as is.
         * Both are float32 here; packing rounds them to the weight type. */
        if ((status = sneppx_pack_gemm(layer, &layer->absorb_uk, heads, 0)) != SNEPPX_OK ||
            (status = sneppx_pack_gemm(layer, &layer->absorb_uv, heads, 0)) != SNEPPX_OK)
            return status;
        float *uk_transposed = malloc(sizeof(float) * (size_t)(rank * nope));
        if (!uk_transposed)
            return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "weights: kv_b_proj absorption");
        for (int64_t h = 0; h < heads; h++) {
            const float *w_uk = w->kv_b_proj_weight + h * per_head * rank;      /* [nope, rank] */
            const float *w_uv = w->kv_b_proj_weight + (h * per_head + nope) * rank; /* [vdim, rank] */
            for (int64_t d = 0; d < nope; d++)
                for (int64_t r = 0; r < rank; r++)
                    uk_transposed[r * nope + d] = w_uk[d * rank + r];
            sneppx_pack_gemm_instance(&layer->absorb_uk, h, uk_transposed, nope);
            sneppx_pack_gemm_instance(&layer->absorb_uv, h, w_uv, rank);
        }
        free(uk_transposed);
    }
    return pack_projection(layer, &layer->o_proj, w->o_proj_weight, w->o_proj_bias);
}

/* sneppx_weights' fields in declaration order (include/sneppx/layer.h). */
static const char *const field_names[] = {
    "q_proj_weight", "q_proj_bias", "k_proj_weight", "k_proj_bias", "v_proj_weight", "v_proj_bias",
    "o_proj_weight", "o_proj_bias", "q_a_proj_weight", "q_a_proj_bias", "q_a_layernorm_weight",
    "q_b_proj_weight", "kv_a_proj_with_mqa_weight", "kv_a_proj_with_mqa_bias", "kv_a_layernorm_weight",
    "kv_b_proj_weight"};
_Static_assert(sizeof field_names / sizeof field_names[0] == sizeof(sneppx_weights) / sizeof(const float *),
               "field_names must list every sneppx_weights field");

sneppx_status sneppx_layer_load_weights(sneppx_layer *layer, const sneppx_weights *weights)
{
    /* The one table of what a config's layer holds (shared with the checkpoint loader). */
    sneppx_attn_tensor tensors[SNEPPX_ATTN_TENSORS_MAX];
    int count = 0;
    sneppx_status status = sneppx_attn_tensors(&layer->config, tensors, &count);
    if (status != SNEPPX_OK)
        return status;
    if (weights) {
        /* Every pointer the config needs must be set, and no other. */
        int needed[sizeof(sneppx_weights) / sizeof(const float *)] = {0};
        for (int i = 0; i < count; i++) {
            needed[tensor_id(&tensors[i])] = 1;
            if (!*weight_slot((sneppx_weights *)weights, &tensors[i]))
                return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                                   "weights.%s: NULL, but this config needs %s [%lld x %lld]",
                                   field_names[tensor_id(&tensors[i])], tensors[i].name,
                                   (long long)tensors[i].shape[0], (long long)(tensors[i].rank == 2 ? tensors[i].shape[1] : 1));
        }
        const float *const *given = (const float *const *)weights;
        for (size_t field = 0; field < sizeof needed / sizeof needed[0]; field++)
            if (given[field] && !needed[field])
                return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                                   "weights.%s: given, but this config has no such tensor", field_names[field]);
        return layer->is_mla ? load_mla(layer, weights) : load_standard(layer, weights);
    }
    sneppx_weights synthetic = {0};
    float *owned[SNEPPX_ATTN_TENSORS_MAX] = {0};
    for (int i = 0; i < count && status == SNEPPX_OK; i++) {
        const sneppx_attn_tensor *tensor = &tensors[i];
        const int is_norm = strstr(tensor->name, "layernorm") != NULL;
        const int64_t in_features = tensor->rank == 2 ? tensor->shape[1] : 1;
        const float scale = tensor->rank == 2 ? (float)(1.0 / sqrt((double)in_features)) : 0.1f;
        owned[i] = synthetic_tensor(tensor_id(tensor), tensor->shape[0] * in_features, scale, is_norm ? 1.0f : 0.0f,
                                    sneppx_thread_count(layer));
        if (!owned[i])
            status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "weights: no memory for synthetic %s", tensor->name);
        else
            *weight_slot(&synthetic, tensor) = owned[i];
    }
    if (status == SNEPPX_OK)
        status = layer->is_mla ? load_mla(layer, &synthetic) : load_standard(layer, &synthetic);
    for (int i = 0; i < count; i++)
        free(owned[i]);
    return status;
}
