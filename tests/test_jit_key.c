/* Canonical kernel keys (sneppx_kernel_key, the C twin of
 * gen/sneppx_gen/kernels.py:kernel_key; tests/lit/jit_key.test compares the two
 * over many keys), their argument errors, their parsing, and the host target. */
#include <stdio.h>
#include <string.h>

#include "host.h"
#include "jit.h"
#include "kernels.h"
#include "sneppx/limits.h"
#include "test_util.h"

#define V16 sneppx_target_named("v16")
#define V8 sneppx_target_named("v8")

static void check_key(test_tally *tally, const char *family, const int64_t *values,
                      const struct sneppx_target *target, const char *want)
{
    char key[SNEPPX_KEY_MAX];
    sneppx_status status = sneppx_kernel_key(family, values, target, key, sizeof key);
    TEST_CHECK(tally, status == SNEPPX_OK && strcmp(key, want) == 0, "%s: got '%s' (%s: %s), want '%s'", family,
               status == SNEPPX_OK ? key : "", sneppx_status_name(status), sneppx_last_error(), want);
}

/* A bad call fails with SNEPPX_ERR_INVALID_ARGUMENT and a message holding `names`. */
static void check_rejected(test_tally *tally, const char *family, const int64_t *values,
                           const struct sneppx_target *target, size_t key_size, const char *names)
{
    char key[SNEPPX_KEY_MAX];
    sneppx_status status = sneppx_kernel_key(family, values, target, key, key_size);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), names) != NULL,
               "%s %s: got %s '%s', want SNEPPX_ERR_INVALID_ARGUMENT naming '%s'", family ? family : "(null)",
               target ? target->name : "(null target)", sneppx_status_name(status), sneppx_last_error(), names);
}

static void test_formats(test_tally *tally)
{
    const int64_t flash[] = {128, 128, 4, 4096, 1};
    check_key(tally, "attn_flash", flash, V16, "attn_flash-d128-dv128-g4-w4096-causal-v16");
    const int64_t mla[] = {192, 128, 1, 0, 2};
    check_key(tally, "attn_sdpa", mla, V8, "attn_sdpa-d192-dv128-g1-w0-mask-v8");
    const int64_t unmasked[] = {64, 64, 7, 0, 0};
    check_key(tally, "attn_flash", unmasked, V16, "attn_flash-d64-dv64-g7-w0-none-v16");
    const int64_t gemm[] = {4096, 6144, 0, 0, 512, 56};
    check_key(tally, "gemm", gemm, V16, "gemm-k4096-n6144-bias0-float32-kc512-mc56-v16");
    const int64_t gemm_bias[] = {896, 1152, 1, 0, 512, 24};
    check_key(tally, "gemm", gemm_bias, V8, "gemm-k896-n1152-bias1-float32-kc512-mc24-v8");
    const int64_t gemm_bf16[] = {4096, 6144, 0, 1, 512, 56}, gemm_f16[] = {896, 1152, 1, 2, 512, 24};
    check_key(tally, "gemm", gemm_bf16, V16, "gemm-k4096-n6144-bias0-bfloat16-kc512-mc56-v16");
    check_key(tally, "gemm", gemm_f16, V8, "gemm-k896-n1152-bias1-float16-kc512-mc24-v8");
    const int64_t gemm_int8[] = {1408, 2048, 0, 3, 512, 112};
    check_key(tally, "gemm", gemm_int8, V16, "gemm-k1408-n2048-bias0-int8-kc512-mc112-v16");
    /* A host's tuned cache blocking is in the key: never the untuned kernel's. */
    const int64_t gemm_tuned[] = {4096, 6144, 0, 0, 128, 14};
    check_key(tally, "gemm", gemm_tuned, V16, "gemm-k4096-n6144-bias0-float32-kc128-mc14-v16");
    const int64_t gemm_bf16dot[] = {4096, 6144, 0}; /* bfloat16 compute: its own family, no weight type */
    check_key(tally, "gemm_bf16dot", gemm_bf16dot, V16, "gemm_bf16dot-k4096-n6144-bias0-v16");
    const int64_t rope_half[] = {128, 0}, rope_inter[] = {64, 1};
    check_key(tally, "rope", rope_half, V16, "rope-r128-half-v16");
    check_key(tally, "rope", rope_inter, V8, "rope-r64-inter-v8");
    const int64_t rmsnorm[] = {512};
    check_key(tally, "rmsnorm", rmsnorm, V16, "rmsnorm-n512-v16");
    const int64_t decode[] = {128, 128, 4, 0, 1, 0}, decode_mla[] = {576, 512, 16, 0, 2, 0};
    check_key(tally, "attn_decode", decode, V16, "attn_decode-d128-dv128-g4-w0-causal-float32-v16");
    check_key(tally, "attn_decode", decode_mla, V8, "attn_decode-d576-dv512-g16-w0-mask-float32-v8");
    /* The KV cache's element type: one kernel per type. */
    const int64_t decode_bf16[] = {128, 128, 4, 0, 1, 1}, decode_f16[] = {128, 128, 4, 4096, 1, 2};
    const int64_t decode_int8[] = {576, 512, 16, 0, 2, 3};
    check_key(tally, "attn_decode", decode_bf16, V16, "attn_decode-d128-dv128-g4-w0-causal-bfloat16-v16");
    check_key(tally, "attn_decode", decode_f16, V8, "attn_decode-d128-dv128-g4-w4096-causal-float16-v8");
    check_key(tally, "attn_decode", decode_int8, V16, "attn_decode-d576-dv512-g16-w0-mask-int8-v16");
}

static void test_errors(test_tally *tally)
{
    const int64_t flash[] = {128, 128, 4, 0, 1};
    check_rejected(tally, "attn_flashy", flash, V16, SNEPPX_KEY_MAX, "attn_flashy");
    check_rejected(tally, NULL, flash, V16, SNEPPX_KEY_MAX, "family");
    check_rejected(tally, "attn_flash", NULL, V16, SNEPPX_KEY_MAX, "values");
    check_rejected(tally, "attn_flash", flash, NULL, SNEPPX_KEY_MAX, "target is NULL");
    const int64_t bad_mode[] = {128, 128, 4, 0, 3};
    check_rejected(tally, "attn_flash", bad_mode, V16, SNEPPX_KEY_MAX, "mask_mode");
    const int64_t negative_mode[] = {128, 128, 4, 0, -1};
    check_rejected(tally, "attn_sdpa", negative_mode, V16, SNEPPX_KEY_MAX, "mask_mode");
    const int64_t negative_dim[] = {-128, 128, 4, 0, 1};
    check_rejected(tally, "attn_flash", negative_dim, V16, SNEPPX_KEY_MAX, "head_dim");
    const int64_t bad_layout[] = {128, 2};
    check_rejected(tally, "rope", bad_layout, V16, SNEPPX_KEY_MAX, "interleaved");
    /* Values a valid config never makes: refused naming the field, by resolve too. */
    const int64_t zero_k[] = {0, 64, 0, 0, 512, 56}, bias_7[] = {64, 64, 7, 0, 512, 56},
                  huge_n[] = {64, 3 * (1 << 20) + 1, 0, 0, 512, 56};
    const int64_t no_weight_type[] = {64, 64, 0, 4, 512, 56};
    check_rejected(tally, "gemm", no_weight_type, V16, SNEPPX_KEY_MAX, "(weight_type of gemm) = 4 is outside [0, 3]");
    check_rejected(tally, "gemm", zero_k, V16, SNEPPX_KEY_MAX, "(k of gemm) = 0 is outside [1, 1048576]");
    check_rejected(tally, "gemm", bias_7, V16, SNEPPX_KEY_MAX, "(bias of gemm) = 7 is outside [0, 1]");
    check_rejected(tally, "gemm", huge_n, V16, SNEPPX_KEY_MAX, "(n of gemm) = 3145729");
    /* The cache blocking: kc whole int8 groups within the targets' candidates, mc rows up to theirs. */
    const int64_t kc_100[] = {64, 64, 0, 0, 100, 56}, kc_4096[] = {64, 64, 0, 0, 4096, 56}, mc_0[] = {64, 64, 0, 0, 512, 0};
    check_rejected(tally, "gemm", kc_100, V16, SNEPPX_KEY_MAX, "(kc of gemm) = 100 is outside [128, 512]");
    check_rejected(tally, "gemm", kc_4096, V16, SNEPPX_KEY_MAX, "(kc of gemm) = 4096 is outside [128, 512]");
    check_rejected(tally, "gemm", mc_0, V16, SNEPPX_KEY_MAX, "(mc of gemm) = 0 is outside [1, 112]");
    const int64_t odd_rope[] = {7, 0}, zero_rope[] = {0, 1};
    check_rejected(tally, "rope", odd_rope, V16, SNEPPX_KEY_MAX, "(rotary_dim of rope) = 7 is not a multiple of 2");
    check_rejected(tally, "rope", zero_rope, V16, SNEPPX_KEY_MAX, "rotary_dim of rope");
    const int64_t zero_norm[] = {0};
    check_rejected(tally, "rmsnorm", zero_norm, V16, SNEPPX_KEY_MAX, "n of rmsnorm");
    const int64_t wide_head[] = {100000, 64, 1, 0, 1}, odd_head[] = {72, 64, 1, 0, 1}, zero_group[] = {64, 64, 0, 0, 1},
                  far_window[] = {64, 64, 1, ((int64_t)1 << 40) + 1, 1};
    check_rejected(tally, "attn_flash", wide_head, V16, SNEPPX_KEY_MAX, "(head_dim of attn_flash) = 100000");
    check_rejected(tally, "attn_sdpa", odd_head, V16, SNEPPX_KEY_MAX, "= 72 is not a multiple of 16");
    check_rejected(tally, "attn_flash", zero_group, V8, SNEPPX_KEY_MAX, "(group of attn_flash) = 0");
    check_rejected(tally, "attn_sdpa", far_window, V8, SNEPPX_KEY_MAX, "window of attn_sdpa");
    /* The largest shapes a valid config makes are accepted (MLA absorbed: kv_lora 2048 + rope 256). */
    const int64_t mla_largest[] = {2304, 2048, 4096, 0, 2};
    check_key(tally, "attn_flash", mla_largest, V16, "attn_flash-d2304-dv2048-g4096-w0-mask-v16");
    /* Every field of every generated family has a non-empty range, and the
     * attention ranges are the config bounds' (one source: limits.py). */
    for (int f = 0; f < sneppx_kernel_family_count; f++)
        for (int i = 0; i < sneppx_kernel_families[f].field_count; i++) {
            const struct sneppx_kernel_family *k = &sneppx_kernel_families[f];
            TEST_CHECK(tally, k->field_min[i] <= k->field_max[i] && k->field_multiple[i] >= 1,
                       "%s.%s: range [%lld, %lld] multiple %lld", k->family, k->field_names[i],
                       (long long)k->field_min[i], (long long)k->field_max[i], (long long)k->field_multiple[i]);
        }
    const struct sneppx_kernel_family *flash_family = sneppx_kernel_family_find("attn_flash");
    TEST_CHECK(tally, flash_family && flash_family->field_max[0] == SNEPPX_MAX_LATENT_DIM + SNEPPX_MAX_HEAD_DIM &&
                          flash_family->field_max[1] == SNEPPX_MAX_LATENT_DIM &&
                          flash_family->field_multiple[0] == SNEPPX_HEAD_DIM_MULTIPLE &&
                          flash_family->field_max[2] == SNEPPX_MAX_HEADS,
               "attn_flash's ranges are not the config bounds of sneppx/limits.h");
    /* attn_decode takes the attention fields' ranges, then the KV cache's element type. */
    const struct sneppx_kernel_family *decode_family = sneppx_kernel_family_find("attn_decode");
    TEST_CHECK(tally, decode_family && flash_family && decode_family->field_count == flash_family->field_count + 1 &&
                          memcmp(decode_family->field_max, flash_family->field_max,
                                 sizeof(int64_t) * (size_t)flash_family->field_count) == 0 &&
                          strcmp(decode_family->field_names[flash_family->field_count], "kv_type") == 0 &&
                          decode_family->field_max[flash_family->field_count] == SNEPPX_DTYPE_COUNT - 1,
               "attn_decode's ranges are not attn_flash's and kv_type's");
    const int64_t odd_decode_head[] = {72, 64, 1, 0, 1, 0};
    check_rejected(tally, "attn_decode", odd_decode_head, V16, SNEPPX_KEY_MAX, "(head_dim of attn_decode) = 72 is not a multiple of 16");
    /* "attn_flash-d128-dv128-g4-w0-causal-v16" is 38 characters: 38 bytes cannot hold it. */
    check_rejected(tally, "attn_flash", flash, V16, 38, "key_size");
    check_key(tally, "attn_flash", flash, V16, "attn_flash-d128-dv128-g4-w0-causal-v16");

    const sneppx_kernel *kernel = (const sneppx_kernel *)1;
    sneppx_status status = sneppx_kernel_resolve("attn_flashy", flash, V16, &kernel);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && kernel == NULL &&
                          strstr(sneppx_last_error(), "attn_flashy") != NULL,
               "resolve of an unknown family: %s '%s'", sneppx_status_name(status), sneppx_last_error());
    status = sneppx_kernel_resolve("attn_flash", bad_mode, V16, &kernel);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), "mask_mode") != NULL,
               "resolve of mask_mode 3: %s '%s'", sneppx_status_name(status), sneppx_last_error());
    status = sneppx_kernel_resolve("attn_flash", wide_head, V16, &kernel);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && kernel == NULL &&
                          strstr(sneppx_last_error(), "head_dim of attn_flash") != NULL,
               "resolve of head_dim 100000: %s '%s'", sneppx_status_name(status), sneppx_last_error());
    status = sneppx_kernel_resolve("attn_flash", flash, V16, NULL);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), "kernel") != NULL,
               "resolve into NULL: %s '%s'", sneppx_status_name(status), sneppx_last_error());
}

/* A key's last part names its target: parsing gives that target, and text
 * whose last part names no target is no key. */
static void test_parse(test_tally *tally)
{
    char family[SNEPPX_KEY_MAX] = "";
    const struct sneppx_target *target = NULL;
    sneppx_status status =
        sneppx_kernel_key_parse("attn_flash-d128-dv128-g4-w0-causal-v8", family, sizeof family, &target);
    TEST_CHECK(tally, status == SNEPPX_OK && strcmp(family, "attn_flash") == 0 && target == V8 && target->vector_width == 8,
               "parse of a v8 key: %s, family '%s', target %s", sneppx_status_name(status), family,
               target ? target->name : "(null)");
    status = sneppx_kernel_key_parse("rmsnorm-n64-v16", family, sizeof family, &target);
    TEST_CHECK(tally, status == SNEPPX_OK && strcmp(family, "rmsnorm") == 0 && target == V16 &&
                          target->vector_width == 16,
               "parse of a v16 key: %s, family '%s', target %s", sneppx_status_name(status), family,
               target ? target->name : "(null)");
    const char *const not_keys[] = {"rmsnorm-n64-v32", "rmsnorm-n64-v16x", "rmsnorm-n64", "rmsnorm", ""};
    for (size_t i = 0; i < sizeof not_keys / sizeof not_keys[0]; i++) {
        status = sneppx_kernel_key_parse(not_keys[i], family, sizeof family, &target);
        TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), "<target>") != NULL,
                   "parse of '%s': %s '%s'", not_keys[i], sneppx_status_name(status), sneppx_last_error());
    }
}

/* LLVM's view of the host agrees with the kernel's: /proc/cpuinfo's avx512f flag. */
static void test_host_target(test_tally *tally)
{
    FILE *cpuinfo = fopen("/proc/cpuinfo", "r");
    if (!cpuinfo) {
        tally->skipped++;
        return;
    }
    char line[8192];
    int avx512 = 0;
    while (fgets(line, sizeof line, cpuinfo))
        if (strncmp(line, "flags", 5) == 0 && strstr(line, " avx512f"))
            avx512 = 1;
    fclose(cpuinfo);
    const struct sneppx_target *target = sneppx_host_target();
    TEST_CHECK(tally, target == sneppx_host_info()->target && target == (avx512 ? V16 : V8) &&
                          target->vector_width == (avx512 ? 16 : 8),
               "host target %s, /proc/cpuinfo avx512f %d", target ? target->name : "(null)", avx512);
    TEST_CHECK(tally, sneppx_target_named("v32") == NULL && sneppx_target_named(NULL) == NULL,
               "sneppx_target_named found a target that does not exist");
}

int main(void)
{
    test_tally tally = {0};
    test_formats(&tally);
    test_errors(&tally);
    test_parse(&tally);
    test_host_target(&tally);
    return test_finish(&tally);
}
