/* The HF tensors of one self_attn module and the shapes a config implies:
 * the one table that both the checkpoint loader and the Python package's
 * load_state_dict() check names and shapes against. */
#include <stddef.h>
#include <string.h>

#include "error.h"
#include "sneppx/safetensors.h"

struct tensor_list {
    sneppx_attn_tensor *tensors;
    int count;
    int overflowed;
};

/* a * b, or 0 with the list marked overflowed (configs are validated, so only absurd sizes get here). */
static int64_t product(struct tensor_list *list, int64_t a, int64_t b)
{
    int64_t result;
    if (__builtin_mul_overflow(a, b, &result)) {
        list->overflowed = 1;
        return 0;
    }
    return result;
}

/* in_features 0 makes a rank-1 tensor (bias, norm weight). */
static void add(struct tensor_list *list, const char *name, size_t weights_offset, int64_t out_features,
                int64_t in_features)
{
    if (list->count >= SNEPPX_ATTN_TENSORS_MAX) {
        list->overflowed = 1;
        return;
    }
    sneppx_attn_tensor *tensor = &list->tensors[list->count++];
    tensor->name = name;
    tensor->rank = in_features > 0 ? 2 : 1;
    tensor->shape[0] = out_features;
    tensor->shape[1] = in_features;
    tensor->weights_offset = weights_offset;
}

#define FIELD(member) offsetof(sneppx_weights, member)

static void list_gqa(const sneppx_config *config, struct tensor_list *list)
{
    int64_t hidden = config->hidden_size;
    int64_t head_dim = config->head_dim > 0 ? config->head_dim : hidden / config->num_attention_heads;
    int64_t q_features = product(list, config->num_attention_heads, head_dim);
    int64_t kv_features = product(list, config->num_key_value_heads, head_dim);

    add(list, "q_proj.weight", FIELD(q_proj_weight), q_features, hidden);
    if (config->qkv_bias)
        add(list, "q_proj.bias", FIELD(q_proj_bias), q_features, 0);
    add(list, "k_proj.weight", FIELD(k_proj_weight), kv_features, hidden);
    if (config->qkv_bias)
        add(list, "k_proj.bias", FIELD(k_proj_bias), kv_features, 0);
    add(list, "v_proj.weight", FIELD(v_proj_weight), kv_features, hidden);
    if (config->qkv_bias)
        add(list, "v_proj.bias", FIELD(v_proj_bias), kv_features, 0);
    add(list, "o_proj.weight", FIELD(o_proj_weight), hidden, q_features);
    if (config->o_bias)
        add(list, "o_proj.bias", FIELD(o_proj_bias), hidden, 0);
}

/* DeepSeek V2 (docs/MODELS.md section 6): attention_bias would add biases to q_a_proj,
 * kv_a_proj_with_mqa (qkv_bias here) and o_proj (o_bias); q_proj, q_b_proj
 * and kv_b_proj never have one. */
static void list_mla(const sneppx_config *config, struct tensor_list *list)
{
    int64_t hidden = config->hidden_size;
    int64_t heads = config->num_attention_heads;
    int64_t q_lora = config->q_lora_rank;
    int64_t kv_lora = config->kv_lora_rank;
    int64_t q_features = product(list, heads, config->qk_nope_head_dim + config->qk_rope_head_dim);
    int64_t kv_a_features = kv_lora + config->qk_rope_head_dim;
    int64_t kv_b_features = product(list, heads, config->qk_nope_head_dim + config->v_head_dim);
    int64_t o_in_features = product(list, heads, config->v_head_dim);

    if (q_lora > 0) {
        add(list, "q_a_proj.weight", FIELD(q_a_proj_weight), q_lora, hidden);
        if (config->qkv_bias)
            add(list, "q_a_proj.bias", FIELD(q_a_proj_bias), q_lora, 0);
        add(list, "q_a_layernorm.weight", FIELD(q_a_layernorm_weight), q_lora, 0);
        add(list, "q_b_proj.weight", FIELD(q_b_proj_weight), q_features, q_lora);
    } else {
        add(list, "q_proj.weight", FIELD(q_proj_weight), q_features, hidden);
    }
    add(list, "kv_a_proj_with_mqa.weight", FIELD(kv_a_proj_with_mqa_weight), kv_a_features, hidden);
    if (config->qkv_bias)
        add(list, "kv_a_proj_with_mqa.bias", FIELD(kv_a_proj_with_mqa_bias), kv_a_features, 0);
    add(list, "kv_a_layernorm.weight", FIELD(kv_a_layernorm_weight), kv_lora, 0);
    add(list, "kv_b_proj.weight", FIELD(kv_b_proj_weight), kv_b_features, kv_lora);
    add(list, "o_proj.weight", FIELD(o_proj_weight), hidden, o_in_features);
    if (config->o_bias)
        add(list, "o_proj.bias", FIELD(o_proj_bias), hidden, 0);
}

sneppx_status sneppx_attn_tensors(const sneppx_config *config, sneppx_attn_tensor tensors[SNEPPX_ATTN_TENSORS_MAX],
                                  int *count)
{
    sneppx_clear_error();
    if (!config || !tensors || !count)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "sneppx_attn_tensors: %s is NULL",
                           !config ? "config" : !tensors ? "tensors" : "count");
    *count = 0;
    sneppx_status status = sneppx_config_validate(config);
    if (status != SNEPPX_OK)
        return status;
    struct tensor_list list = {tensors, 0, 0};
    if (config->kv_lora_rank > 0)
        list_mla(config, &list);
    else
        list_gqa(config, &list);
    if (list.overflowed)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config '%s': a weight shape overflows int64",
                           config->name);
    *count = list.count;
    return SNEPPX_OK;
}

int sneppx_attn_tensor_is_ignored(const char *name)
{
    /* Older Llama checkpoints saved the RoPE inverse frequencies as a buffer;
     * the runtime derives them from the config in double precision instead. */
    return name && strcmp(name, "rotary_emb.inv_freq") == 0;
}
