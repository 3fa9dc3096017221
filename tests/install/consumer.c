/* A program of another project: the installed headers, libsneppx, nothing
 * else. Runs one small layer on synthetic weights and prints its status and
 * first output (the install test compares the two builds' lines). */
#include <sneppx/sneppx.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    sneppx_config config;
    sneppx_config_init(&config);
    config.hidden_size = 64;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
    sneppx_layer *layer;
    if (sneppx_layer_create(&config, NULL, &layer) != SNEPPX_OK) {
        fprintf(stderr, "consumer: %s\n", sneppx_last_error());
        return 1;
    }
    enum { TOKENS = 4, HIDDEN = 64 };
    float x[TOKENS * HIDDEN], y[TOKENS * HIDDEN];
    for (int i = 0; i < TOKENS * HIDDEN; i++)
        x[i] = (float)(i % 7) - 3.0f;
    sneppx_status status = sneppx_layer_forward(layer, 1, TOKENS, x, NULL, NULL, NULL, y);
    printf("%s %.6f\n", sneppx_status_name(status), y[0]);
    sneppx_layer_destroy(layer);
    return status != SNEPPX_OK;
}
