/* Internal: RoPE frequencies, rendered from templates/rope_freqs.c.j2 (the
 * same source the vendored AOT files carry). */
#ifndef SNEPPX_RUNTIME_ROPE_FREQS_H
#define SNEPPX_RUNTIME_ROPE_FREQS_H
#include <stdint.h>
#include "sneppx/config.h"

struct sneppx_rope_params {
    int type;                 /* sneppx_rope_type */
    double theta;
    int64_t rotary_dim;
    double factor, low_freq_factor, high_freq_factor;
    int64_t original_max_position_embeddings; /* 0 = max_position_embeddings */
    int64_t max_position_embeddings;
    double beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor;
};

double sneppx_yarn_get_mscale(double scale, double mscale);

void sneppx_rope_inv_freq(const struct sneppx_rope_params *params, int64_t seq_len,
                          double *inv_freq, double *attention_factor);

#endif
