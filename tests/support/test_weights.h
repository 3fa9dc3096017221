/* Random HF-layout weights for any config (GQA or MLA), owned by the test. */
#ifndef SNEPPX_TEST_WEIGHTS_H
#define SNEPPX_TEST_WEIGHTS_H

#include <stdint.h>
#include "sneppx/config.h"
#include "sneppx/layer.h"

#define TEST_WEIGHTS_MAX_TENSORS 16

typedef struct test_weights {
    sneppx_weights view;                       /* what sneppx_layer_create and the reference read */
    float *tensors[TEST_WEIGHTS_MAX_TENSORS];  /* owned */
    int tensor_count;
} test_weights;

/* Number of floats the config's weights take (biases included), 0 if the config
 * is not representable. Lets a test decide between random and synthetic weights. */
int64_t test_weights_float_count(const sneppx_config *config);

/* Fills every tensor the config uses: matrices uniform with variance 1/in_features
 * (outputs of order 1), biases uniform in [-0.5, 0.5), RMSNorm weights in [0.5, 1.5).
 * Tensors the config does not use stay NULL. Returns 0, or -1 (out of memory /
 * config the reference cannot represent; nothing to free then). */
int test_weights_random(const sneppx_config *config, uint64_t seed, test_weights *weights);

void test_weights_free(test_weights *weights);

#endif
