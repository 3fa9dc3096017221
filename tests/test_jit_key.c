/* Canonical kernel keys (sneppx_kernel_key, the C twin of
 * gen/sneppx_gen/kernels.py:kernel_key; tests/lit/jit_key.test compares the two
 * over many keys), their argument errors, and the host vector width. */
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "test_util.h"

static void check_key(test_tally *tally, const char *family, const int64_t *values, int vector_width,
                      const char *want)
{
    char key[SNEPPX_KEY_MAX];
    sneppx_status status = sneppx_kernel_key(family, values, vector_width, key, sizeof key);
    TEST_CHECK(tally, status == SNEPPX_OK && strcmp(key, want) == 0, "%s: got '%s' (%s: %s), want '%s'", family,
               status == SNEPPX_OK ? key : "", sneppx_status_name(status), sneppx_last_error(), want);
}

/* A bad call fails with SNEPPX_ERR_INVALID_ARGUMENT and a message holding `names`. */
static void check_rejected(test_tally *tally, const char *family, const int64_t *values, int vector_width,
                           size_t key_size, const char *names)
{
    char key[SNEPPX_KEY_MAX];
    sneppx_status status = sneppx_kernel_key(family, values, vector_width, key, key_size);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), names) != NULL,
               "%s v%d: got %s '%s', want SNEPPX_ERR_INVALID_ARGUMENT naming '%s'", family ? family : "(null)",
               vector_width, sneppx_status_name(status), sneppx_last_error(), names);
}

static void test_formats(test_tally *tally)
{
    const int64_t flash[] = {128, 128, 4, 4096, 1};
    check_key(tally, "attn_flash", flash, 16, "attn_flash-d128-dv128-g4-w4096-causal-v16");
    const int64_t mla[] = {192, 128, 1, 0, 2};
    check_key(tally, "attn_sdpa", mla, 8, "attn_sdpa-d192-dv128-g1-w0-mask-v8");
    const int64_t unmasked[] = {64, 64, 7, 0, 0};
    check_key(tally, "attn_flash", unmasked, 16, "attn_flash-d64-dv64-g7-w0-none-v16");
    const int64_t gemm[] = {4096, 6144, 0};
    check_key(tally, "gemm", gemm, 16, "gemm-k4096-n6144-bias0-v16");
    const int64_t gemm_bias[] = {896, 1152, 1};
    check_key(tally, "gemm", gemm_bias, 8, "gemm-k896-n1152-bias1-v8");
    const int64_t rope_half[] = {128, 0}, rope_inter[] = {64, 1};
    check_key(tally, "rope", rope_half, 16, "rope-r128-half-v16");
    check_key(tally, "rope", rope_inter, 8, "rope-r64-inter-v8");
    const int64_t rmsnorm[] = {512};
    check_key(tally, "rmsnorm", rmsnorm, 16, "rmsnorm-n512-v16");
}

static void test_errors(test_tally *tally)
{
    const int64_t flash[] = {128, 128, 4, 0, 1};
    check_rejected(tally, "attn_flashy", flash, 16, SNEPPX_KEY_MAX, "attn_flashy");
    check_rejected(tally, NULL, flash, 16, SNEPPX_KEY_MAX, "family");
    check_rejected(tally, "attn_flash", NULL, 16, SNEPPX_KEY_MAX, "values");
    check_rejected(tally, "attn_flash", flash, 4, SNEPPX_KEY_MAX, "vector_width");
    const int64_t bad_mode[] = {128, 128, 4, 0, 3};
    check_rejected(tally, "attn_flash", bad_mode, 16, SNEPPX_KEY_MAX, "mask_mode");
    const int64_t negative_mode[] = {128, 128, 4, 0, -1};
    check_rejected(tally, "attn_sdpa", negative_mode, 16, SNEPPX_KEY_MAX, "mask_mode");
    const int64_t negative_dim[] = {-128, 128, 4, 0, 1};
    check_rejected(tally, "attn_flash", negative_dim, 16, SNEPPX_KEY_MAX, "head_dim");
    const int64_t bad_layout[] = {128, 2};
    check_rejected(tally, "rope", bad_layout, 16, SNEPPX_KEY_MAX, "interleaved");
    /* "attn_flash-d128-dv128-g4-w0-causal-v16" is 38 characters: 38 bytes cannot hold it. */
    check_rejected(tally, "attn_flash", flash, 16, 38, "key_size");
    check_key(tally, "attn_flash", flash, 16, "attn_flash-d128-dv128-g4-w0-causal-v16");

    const sneppx_kernel *kernel = (const sneppx_kernel *)1;
    sneppx_status status = sneppx_kernel_resolve("attn_flashy", flash, 16, &kernel);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && kernel == NULL &&
                          strstr(sneppx_last_error(), "attn_flashy") != NULL,
               "resolve of an unknown family: %s '%s'", sneppx_status_name(status), sneppx_last_error());
    status = sneppx_kernel_resolve("attn_flash", bad_mode, 16, &kernel);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), "mask_mode") != NULL,
               "resolve of mask_mode 3: %s '%s'", sneppx_status_name(status), sneppx_last_error());
    status = sneppx_kernel_resolve("attn_flash", flash, 16, NULL);
    TEST_CHECK(tally, status == SNEPPX_ERR_INVALID_ARGUMENT && strstr(sneppx_last_error(), "kernel") != NULL,
               "resolve into NULL: %s '%s'", sneppx_status_name(status), sneppx_last_error());
}

/* LLVM's view of the host agrees with the kernel's: /proc/cpuinfo's avx512f flag. */
static void test_host_vector_width(test_tally *tally)
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
    int width = sneppx_host_vector_width();
    TEST_CHECK(tally, width == (avx512 ? 16 : 8), "host vector width %d, /proc/cpuinfo avx512f %d", width, avx512);
}

int main(void)
{
    test_tally tally = {0};
    test_formats(&tally);
    test_errors(&tally);
    test_host_vector_width(&tally);
    return test_finish(&tally);
}
