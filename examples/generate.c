/* Generation from C: two layers of Qwen2-0.5B's attention share one paged KV
 * cache; two prompts of different lengths are prefilled in one call, then
 * decoded one token per step, then one sequence is forked and rolled back. */
#include <sneppx/sneppx.h>
#include <stdio.h>
#include <stdlib.h>

#define LAYERS 2

static int fail(const char *call)
{
    fprintf(stderr, "%s: %s\n", call, sneppx_last_error());
    return 1;
}

/* Stands in for the embeddings of the tokens: rows x hidden floats. */
static void fake_hidden(float *x, int64_t count, uint32_t seed)
{
    for (int64_t i = 0; i < count; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 8388608.0f - 1.0f;
    }
}

int main(void)
{
    sneppx_config config;
    if (sneppx_config_from_name("qwen2", "0.5B", &config) != SNEPPX_OK)
        return fail("sneppx_config_from_name");
    sneppx_layer *layers[LAYERS];
    for (int l = 0; l < LAYERS; l++) /* NULL weights: synthetic ones (sneppx_layer_create) */
        if (sneppx_layer_create(&config, NULL, &layers[l]) != SNEPPX_OK)
            return fail("sneppx_layer_create");

    /* One cache for both layers: pages of the default size, room for 256 tokens. */
    sneppx_kv_cache_options options;
    sneppx_kv_cache_options_init(&options);
    options.capacity_tokens = 256;
    options.num_layers = LAYERS;
    sneppx_kv_cache *cache;
    if (sneppx_kv_cache_create(&config, &options, &cache) != SNEPPX_OK)
        return fail("sneppx_kv_cache_create");
    int64_t seq[2];
    for (int s = 0; s < 2; s++)
        if (sneppx_kv_cache_add_sequence(cache, &seq[s]) != SNEPPX_OK)
            return fail("sneppx_kv_cache_add_sequence");

    const int64_t hidden = config.hidden_size;
    float *x = malloc(sizeof(float) * (size_t)(32 * hidden)), *y = malloc(sizeof(float) * (size_t)(32 * hidden));
    if (!x || !y)
        return 1;
    /* Prefill: prompts of 20 and 7 tokens, packed one after the other, in one call per layer.
     * Each layer's output is the next layer's input (a real model adds the MLP in between). */
    int64_t q_lens[2] = {20, 7};
    fake_hidden(x, 27 * hidden, 1);
    for (int l = 0; l < LAYERS; l++) {
        if (sneppx_layer_forward_cached(layers[l], cache, l, 2, seq, q_lens, x, NULL, NULL, y) != SNEPPX_OK)
            return fail("sneppx_layer_forward_cached");
        float *t = x; x = y; y = t;
    }
    /* Decode: one token per sequence per step; positions continue from each cached length. */
    q_lens[0] = q_lens[1] = 1;
    for (int step = 0; step < 8; step++) {
        fake_hidden(x, 2 * hidden, 100 + (uint32_t)step);
        for (int l = 0; l < LAYERS; l++) {
            if (sneppx_layer_forward_cached(layers[l], cache, l, 2, seq, q_lens, x, NULL, NULL, y) != SNEPPX_OK)
                return fail("sneppx_layer_forward_cached");
            float *t = x; x = y; y = t;
        }
    }
    /* Beam search / a shared prompt: fork the first sequence (pages shared, copied on
     * write); speculative decoding's rollback: truncate the fork back to 24 tokens. */
    int64_t fork, lengths[3];
    if (sneppx_kv_cache_fork(cache, seq[0], &fork) != SNEPPX_OK ||
        sneppx_kv_cache_truncate(cache, fork, 24) != SNEPPX_OK)
        return fail("fork / truncate");
    sneppx_kv_cache_length(cache, seq[0], &lengths[0]);
    sneppx_kv_cache_length(cache, seq[1], &lengths[1]);
    sneppx_kv_cache_length(cache, fork, &lengths[2]);
    printf("cached tokens: %lld, %lld, fork %lld; last output %.5f %.5f\n", (long long)lengths[0],
           (long long)lengths[1], (long long)lengths[2], x[0], x[hidden]);
    sneppx_kv_cache_destroy(cache);
    for (int l = 0; l < LAYERS; l++)
        sneppx_layer_destroy(layers[l]);
    free(x), free(y);
    return 0;
}
