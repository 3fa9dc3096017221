/* Random weights for a config, in the shapes of include/sneppx/layer.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mha_reference.h"
#include "test_util.h"
#include "test_weights.h"

enum tensor_kind { MATRIX, BIAS, NORM };

/* One tensor to make: its slot in sneppx_weights, shape, and how to fill it. */
typedef struct tensor_plan {
    const float **slot;
    int64_t rows, cols; /* [out_features, in_features]; vectors have cols = 1 */
    enum tensor_kind kind;
} tensor_plan;

static int plan_tensors(const sneppx_config *config, sneppx_weights *view, tensor_plan *plan)
{
    ref_dims d;
    if (ref_dims_of(config, &d))
        return -1;
    int count = 0;
#define PLAN(field, r, c, k) (plan[count++] = (tensor_plan){&view->field, (r), (c), (k)})
    const int64_t h = d.hidden;
    if (d.mla) {
        const int64_t q_width = d.heads * d.qk_head_dim;
        if (d.q_lora_rank > 0) {
            PLAN(q_a_proj_weight, d.q_lora_rank, h, MATRIX);
            if (config->qkv_bias)
                PLAN(q_a_proj_bias, d.q_lora_rank, 1, BIAS);
            PLAN(q_a_layernorm_weight, d.q_lora_rank, 1, NORM);
            PLAN(q_b_proj_weight, q_width, d.q_lora_rank, MATRIX);
        } else {
            PLAN(q_proj_weight, q_width, h, MATRIX);
        }
        PLAN(kv_a_proj_with_mqa_weight, d.kv_lora_rank + d.rotary_dim, h, MATRIX);
        if (config->qkv_bias)
            PLAN(kv_a_proj_with_mqa_bias, d.kv_lora_rank + d.rotary_dim, 1, BIAS);
        PLAN(kv_a_layernorm_weight, d.kv_lora_rank, 1, NORM);
        PLAN(kv_b_proj_weight, d.heads * (d.nope_dim + d.v_head_dim), d.kv_lora_rank, MATRIX);
    } else {
        const int64_t q_width = d.heads * d.qk_head_dim, kv_width = d.kv_heads * d.qk_head_dim;
        PLAN(q_proj_weight, q_width, h, MATRIX);
        PLAN(k_proj_weight, kv_width, h, MATRIX);
        PLAN(v_proj_weight, kv_width, h, MATRIX);
        if (config->qkv_bias) {
            PLAN(q_proj_bias, q_width, 1, BIAS);
            PLAN(k_proj_bias, kv_width, 1, BIAS);
            PLAN(v_proj_bias, kv_width, 1, BIAS);
        }
    }
    PLAN(o_proj_weight, h, d.heads * d.v_head_dim, MATRIX);
    if (config->o_bias)
        PLAN(o_proj_bias, h, 1, BIAS);
#undef PLAN
    return count;
}

int64_t test_weights_float_count(const sneppx_config *config)
{
    sneppx_weights view;
    tensor_plan plan[TEST_WEIGHTS_MAX_TENSORS];
    const int count = plan_tensors(config, &view, plan);
    int64_t total = 0;
    for (int i = 0; i < count; i++)
        total += plan[i].rows * plan[i].cols;
    return count < 0 ? 0 : total;
}

int test_weights_random(const sneppx_config *config, uint64_t seed, test_weights *weights)
{
    memset(weights, 0, sizeof *weights);
    tensor_plan plan[TEST_WEIGHTS_MAX_TENSORS];
    const int count = plan_tensors(config, &weights->view, plan);
    if (count < 0)
        return -1;
    test_rng rng = test_rng_seeded(seed);
    for (int t = 0; t < count; t++) {
        const int64_t n = plan[t].rows * plan[t].cols;
        float *tensor = malloc((size_t)n * sizeof *tensor);
        if (!tensor) {
            test_weights_free(weights);
            return -1;
        }
        weights->tensors[weights->tensor_count++] = tensor;
        *plan[t].slot = tensor;
        if (plan[t].kind == MATRIX) {
            /* uniform(-a, a) has variance a^2/3: a = sqrt(3/in) gives variance 1/in. */
            test_fill_uniform(&rng, tensor, n, (float)sqrt(3.0 / (double)plan[t].cols));
        } else if (plan[t].kind == BIAS) {
            test_fill_uniform(&rng, tensor, n, 0.5f);
        } else {
            for (int64_t i = 0; i < n; i++)
                tensor[i] = 1.0f + test_rng_symmetric(&rng, 0.5f);
        }
    }
    return 0;
}

void test_weights_free(test_weights *weights)
{
    for (int t = 0; t < weights->tensor_count; t++)
        free(weights->tensors[t]);
    memset(weights, 0, sizeof *weights);
}
