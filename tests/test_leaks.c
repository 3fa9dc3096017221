/* 1000 create / forward / destroy cycles leak nothing.
 *
 * Each cycle builds a GQA layer and an MLA layer, runs forwards of two shapes
 * (causal, and explicit mask with position_ids), switches flash/SDPA, takes
 * the failing paths (bad weights after the kernels resolved, bad forward
 * arguments, a bad config.json) and destroys everything.
 *
 * Under the sanitizer build LeakSanitizer checks at exit that nothing
 * allocated here is unreachable. In the other builds the resident set may
 * not grow by more than RSS_GROWTH_LIMIT between cycle WARMUP_CYCLES and the
 * last: a leak of one workspace or packed weight per cycle (>= 16 KiB) would
 * add > 15 MiB, one of 2 KiB per cycle still adds ~2 MiB. (ASan keeps freed
 * blocks in its quarantine, up to 256 MiB, so its resident set says nothing.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sneppx/sneppx.h"
#include "test_util.h"

enum { CYCLES = 1000, WARMUP_CYCLES = 50, HIDDEN = 64, BATCH = 2, SEQ = 20 };
#define RSS_GROWTH_LIMIT (1.5 * 1024 * 1024)

/* Resident set size in bytes, from /proc/self/statm. */
static double resident_bytes(void)
{
    long pages = 0, resident = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    if (statm) {
        if (fscanf(statm, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(statm);
    }
    return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

static void gqa_config(sneppx_config *c)
{
    sneppx_config_init(c);
    c->hidden_size = HIDDEN, c->num_attention_heads = 4, c->num_key_value_heads = 2, c->head_dim = 16;
    c->sliding_window = 7;
}

static void mla_config(sneppx_config *c)
{
    sneppx_config_init(c);
    c->hidden_size = HIDDEN, c->num_attention_heads = 2, c->num_key_value_heads = 2;
    c->q_lora_rank = 32, c->kv_lora_rank = 32, c->qk_nope_head_dim = 16, c->qk_rope_head_dim = 16;
    c->v_head_dim = 16, c->rope_interleaved = 1;
}

struct inputs {
    float hidden[BATCH * SEQ * HIDDEN], out[BATCH * SEQ * HIDDEN], mask[BATCH * SEQ * SEQ];
    int64_t positions[BATCH * SEQ];
    int64_t mask_shape[4];
};

/* One layer's share of a cycle; returns the number of unexpected outcomes. */
static int exercise(const sneppx_config *config, struct inputs *in, char *error, size_t error_size)
{
    sneppx_layer *layer = NULL;
    int failures = 0;
    if (sneppx_layer_create(config, NULL, &layer) != SNEPPX_OK) {
        snprintf(error, error_size, "create: %s", sneppx_last_error());
        return 1;
    }
    failures += sneppx_layer_forward(layer, BATCH, SEQ, in->hidden, NULL, NULL, NULL, in->out) != SNEPPX_OK;
    failures += sneppx_layer_set_flash(layer, 0) != SNEPPX_OK;
    failures += sneppx_layer_forward(layer, BATCH, SEQ / 2, in->hidden, NULL, NULL, in->positions, in->out) !=
                SNEPPX_OK;
    failures += sneppx_layer_set_flash(layer, 1) != SNEPPX_OK;
    failures += sneppx_layer_forward(layer, BATCH, SEQ, in->hidden, in->mask, in->mask_shape, in->positions,
                                     in->out) != SNEPPX_OK;
    /* Refused calls must not leak what they allocated before the refusal. */
    failures += sneppx_layer_forward(layer, BATCH, SEQ, in->hidden, in->mask, NULL, NULL, in->out) == SNEPPX_OK;
    if (failures)
        snprintf(error, error_size, "forward: %s", sneppx_last_error());
    sneppx_layer_destroy(layer);
    return failures;
}

/* Failing paths that allocate before they fail. */
static int exercise_failures(const sneppx_config *config)
{
    static const float weight[4 * HIDDEN * HIDDEN];
    const sneppx_weights missing_v = {.q_proj_weight = weight, .q_proj_bias = weight, .k_proj_weight = weight,
                                      .k_proj_bias = weight, .v_proj_bias = weight, .o_proj_weight = weight,
                                      .o_proj_bias = weight};
    sneppx_layer *layer = NULL;
    int unexpected = sneppx_layer_create(config, &missing_v, &layer) != SNEPPX_ERR_INVALID_ARGUMENT || layer;
    static const char bad_json[] = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, "
                                   "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": \"8\"}}";
    sneppx_config parsed;
    unexpected += sneppx_config_from_json(bad_json, sizeof bad_json - 1, &parsed) != SNEPPX_ERR_FORMAT;
    return unexpected;
}

int main(void)
{
    test_tally tally = {0};
    static struct inputs in;
    test_rng rng = test_rng_seeded(5);
    test_fill_uniform(&rng, in.hidden, BATCH * SEQ * HIDDEN, 1.0f);
    for (int64_t b = 0; b < BATCH; b++)
        for (int64_t i = 0; i < SEQ; i++) {
            in.positions[b * SEQ + i] = 3 + 2 * i;
            for (int64_t j = 0; j < SEQ; j++)
                in.mask[(b * SEQ + i) * SEQ + j] = j <= i ? -0.5f * (float)j / SEQ : -1e38f;
        }
    const int64_t shape[4] = {BATCH, 1, SEQ, SEQ};
    memcpy(in.mask_shape, shape, sizeof shape);

    sneppx_config gqa, mla;
    gqa_config(&gqa);
    mla_config(&mla);
    int failures = 0;
    char error[600] = "";
    double rss_after_warmup = 0;
    for (int cycle = 0; cycle < CYCLES; cycle++) {
        failures += exercise(&gqa, &in, error, sizeof error);
        failures += exercise(&mla, &in, error, sizeof error);
        failures += exercise_failures(&gqa);
        if (cycle + 1 == WARMUP_CYCLES)
            rss_after_warmup = resident_bytes();
    }
    const double growth = resident_bytes() - rss_after_warmup;
    TEST_CHECK(&tally, failures == 0, "%d unexpected outcomes over %d cycles (last: %s)", failures, CYCLES, error);
    if (TEST_UNDER_ASAN) {
        printf("%d create/forward/destroy cycles of a GQA and an MLA layer; LeakSanitizer checks at exit\n", CYCLES);
    } else {
        TEST_CHECK(&tally, growth <= RSS_GROWTH_LIMIT,
                   "resident set grew %.0f KiB from cycle %d to %d (limit %.0f KiB)", growth / 1024, WARMUP_CYCLES,
                   CYCLES, RSS_GROWTH_LIMIT / 1024);
        printf("%d create/forward/destroy cycles of a GQA and an MLA layer: resident set %+.0f KiB after cycle %d\n",
               CYCLES, growth / 1024, WARMUP_CYCLES);
    }
    return test_finish(&tally);
}
