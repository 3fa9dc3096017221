/* One LLaMA-3-8B attention layer from C: config, weights, forward. */
#include <sneppx/sneppx.h>
#include <stdio.h>
#include <stdlib.h>

/* Stands in for a checkpoint tensor: rows x cols floats, uniform in [-scale, scale). */
static float *fake_tensor(int64_t rows, int64_t cols, float scale)
{
    float *t = malloc(sizeof(float) * (size_t)(rows * cols));
    uint32_t state = (uint32_t)(rows + 7 * cols);
    for (int64_t i = 0; t && i < rows * cols; i++) {
        state = state * 1664525u + 1013904223u;
        t[i] = scale * ((float)(state >> 8) / 8388608.0f - 1.0f);
    }
    return t;
}

static int fail(const char *call)
{
    fprintf(stderr, "%s: %s\n", call, sneppx_last_error());
    return 1;
}

int main(void)
{
    sneppx_config config; /* or sneppx_config_init(&config) and set the fields by hand */
    if (sneppx_config_from_name("llama3", "8B", &config) != SNEPPX_OK)
        return fail("sneppx_config_from_name");
    const int64_t hidden = config.hidden_size;
    const int64_t q_rows = config.num_attention_heads * config.head_dim;
    const int64_t kv_rows = config.num_key_value_heads * config.head_dim;

    /* HF tensors, row-major [out_features, in_features]. Passing NULL instead of
     * &weights gives deterministic synthetic weights. */
    float *wq = fake_tensor(q_rows, hidden, 0.02f), *wk = fake_tensor(kv_rows, hidden, 0.02f);
    float *wv = fake_tensor(kv_rows, hidden, 0.02f), *wo = fake_tensor(hidden, q_rows, 0.02f);
    if (!wq || !wk || !wv || !wo)
        return 1;
    const sneppx_weights weights = {.q_proj_weight = wq, .k_proj_weight = wk,
                                    .v_proj_weight = wv, .o_proj_weight = wo};
    /* Compiles (or loads from the disk cache) the layer's kernels and packs a copy of the weights. */
    sneppx_layer *layer;
    if (sneppx_layer_create(&config, &weights, &layer) != SNEPPX_OK)
        return fail("sneppx_layer_create");
    free(wq), free(wk), free(wv), free(wo);

    const int64_t batch = 1, seq_len = 16;
    float *x = fake_tensor(batch * seq_len, hidden, 1.0f);
    float *y = malloc(sizeof(float) * (size_t)(batch * seq_len * hidden));
    if (!x || !y)
        return 1;
    /* mask NULL = causal (+ sliding window), position_ids NULL = 0 .. seq_len-1 */
    if (sneppx_layer_forward(layer, batch, seq_len, x, NULL, NULL, NULL, y) != SNEPPX_OK)
        return fail("sneppx_layer_forward");
    const float *last = y + (seq_len - 1) * hidden;
    printf("y[0, %lld, 0:3] = %.5f %.5f %.5f\nkernels:\n%s", (long long)(seq_len - 1), last[0], last[1], last[2],
           sneppx_layer_keys(layer));
    sneppx_layer_destroy(layer);
    free(x), free(y);
    return 0;
}
