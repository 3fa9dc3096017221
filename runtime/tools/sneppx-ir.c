/* sneppx-ir: prints the LLVM IR the JIT makes of one kernel key, through the
 * same specialization and optimization code path as the runtime (for lit
 * tests and for reading what specialization did).
 *
 *   sneppx-ir --family attn_flash --value head_dim=128 --value v_head_dim=128 \
 *             --value group=4 --value window=0 --value mask_mode=causal \
 *             [--target v16 | --vector-width 16] [--stage specialized|optimized] [--passes TEXT]
 *             [--print-key]
 *   sneppx-ir --list-targets
 *
 * --print-key prints the canonical key instead (tests/lit/jit_key.test checks
 * it against the generator's kernel_key). --list-targets prints the runtime's
 * target table with each target's GEMM tile and decode_int8_dot and marks the host's
 * (tests/python/test_targets.py checks it against gen/sneppx_gen/targets.py).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_tiles.h"
#include "host.h"
#include "jit.h"
#include "error.h"
#include "kernel_registry.h"
#include "sneppx/status.h"
#include "sneppx_abi.h"

static void usage(FILE *out)
{
    fputs("usage: sneppx-ir --family NAME --value FIELD=VALUE... [--target NAME | --vector-width W]\n"
          "                 [--stage specialized|optimized] [--passes TEXT] [--print-key]\n"
          "       sneppx-ir --list-targets\n"
          "Prints the LLVM IR of one kernel key as the JIT builds it for this host:\n"
          "  specialized  spec_ globals constant, entries renamed, host CPU attributes\n"
          "  optimized    and the family's JIT pass pipeline run (the default)\n"
          "--passes runs TEXT (LLVM's pipeline syntax, e.g. default<O2>) instead of the family's.\n"
          "--print-key prints the key's canonical text instead.\n"
          "--target picks a target by name (default: the host's), --vector-width the first\n"
          "of that vector width; --list-targets lists them, in order of preference, the host's marked.\n"
          "A target narrower than the host's gets the host's features narrowed to it, as\n"
          "SNEPPX_TARGET runs it (which --target overrides).\n"
          "A choice field takes its name or its index (mask_mode=causal, mask_mode=1).\n"
          "A GEMM's kc and mc, when neither is given, are the target's defaults (not a host's tuning).\n",
          out);
}

/* One line per target: name, vector width, required LLVM features, GEMM tile, and "host" on the host's. */
static void list_targets(void)
{
    for (int i = 0; i < sneppx_target_count; i++) {
        const struct sneppx_target *target = &sneppx_targets[i];
        printf("%s vector_width=%d features=", target->name, target->vector_width);
        for (const char *const *feature = target->features; *feature; feature++)
            printf("%s%s", feature == target->features ? "" : ",", *feature);
        printf(" gemm_mr=%d gemm_nr=%d gemm_kc=%d gemm_mc=%d gemm_int8_mc=%d", target->gemm_mr, target->gemm_nr,
               target->gemm_kc, target->gemm_mc, target->gemm_int8_mc);
        for (int c = 0; c < target->gemm_kc_candidate_count; c++)
            printf("%s%d", c ? "," : " gemm_kc_candidates=", target->gemm_kc_candidates[c]);
        for (int c = 0; c < target->gemm_mc_candidate_count; c++)
            printf("%s%d", c ? "," : " gemm_mc_candidates=", target->gemm_mc_candidates[c]);
        printf(" decode_int8_dot=%d", target->decode_int8_dot);
        printf("%s\n", target == sneppx_host_info()->target ? " host" : "");
    }
}

/* The target called text; else prints the names there are and returns NULL. */
static const struct sneppx_target *parse_target(const char *text)
{
    const struct sneppx_target *target = sneppx_target_named(text);
    if (target)
        return target;
    fprintf(stderr, "sneppx-ir: --target %s: must be one of", sneppx_clip(text).text);
    for (int i = 0; i < sneppx_target_count; i++)
        fprintf(stderr, " %s", sneppx_targets[i].name);
    fputc('\n', stderr);
    return NULL;
}

/* The first target of the vector width text, in order of preference (an alias
 * of --target); else prints the widths there are, each once, and returns NULL. */
static const struct sneppx_target *parse_vector_width(const char *text)
{
    char *end;
    errno = 0;
    long width = strtol(text, &end, 10);
    if (text[0] && *end == '\0' && errno == 0)
        for (int i = 0; i < sneppx_target_count; i++)
            if (sneppx_targets[i].vector_width == width)
                return &sneppx_targets[i];
    fprintf(stderr, "sneppx-ir: --vector-width %s: must be one of", sneppx_clip(text).text);
    for (int i = 0; i < sneppx_target_count; i++) {
        int first = 1;
        for (int j = 0; j < i; j++)
            first &= sneppx_targets[j].vector_width != sneppx_targets[i].vector_width;
        if (first)
            fprintf(stderr, " %d", sneppx_targets[i].vector_width);
    }
    fputc('\n', stderr);
    return NULL;
}

static int field_index(const struct sneppx_kernel_family *family, const char *name, size_t length)
{
    for (int i = 0; i < family->field_count; i++)
        if (strlen(family->field_names[i]) == length && strncmp(family->field_names[i], name, length) == 0)
            return i;
    return -1;
}

/* Parses "FIELD=VALUE" into values[]; prints the problem and returns 0 if it is
 * not one: an unknown field, a field given twice, text that is no integer (or
 * choice name) or does not fit in int64, a value the runtime would refuse in
 * a key (sneppx_kernel_check_value, the check every resolve makes). */
static int parse_value(const struct sneppx_kernel_family *family, const char *assignment, int64_t *values,
                       int *seen)
{
    const char *equals = strchr(assignment, '=');
    int field = equals ? field_index(family, assignment, (size_t)(equals - assignment)) : -1;
    if (field < 0) {
        fprintf(stderr, "sneppx-ir: --value %s: expected FIELD=VALUE with FIELD one of", sneppx_clip(assignment).text);
        for (int i = 0; i < family->field_count; i++)
            fprintf(stderr, " %s", family->field_names[i]);
        fputc('\n', stderr);
        return 0;
    }
    if (seen[field]) {
        fprintf(stderr, "sneppx-ir: --value %s: %s is given twice\n", sneppx_clip(assignment).text,
                family->field_names[field]);
        return 0;
    }
    const char *text = equals + 1;
    int64_t value = -1;
    for (int choice = 0; family->field_choices[field] && choice <= family->field_max[field]; choice++)
        if (strcmp(text, family->field_choices[field][choice]) == 0)
            value = choice;
    if (value < 0) {
        char *end;
        errno = 0;
        long long number = strtoll(text, &end, 10);
        if (!text[0] || *end != '\0' || errno == ERANGE) {
            fprintf(stderr, "sneppx-ir: --value %s: '%s' is not an integer%s%s\n", sneppx_clip(assignment).text,
                    sneppx_clip(text).text,
                    family->field_choices[field] ? " or a choice name" : "",
                    errno == ERANGE ? " that fits in int64" : "");
            return 0;
        }
        value = number;
    }
    if (sneppx_kernel_check_value(family, field, value) != SNEPPX_OK) {
        fprintf(stderr, "sneppx-ir: --value %s: %s\n", sneppx_clip(assignment).text, sneppx_last_error());
        return 0;
    }
    values[field] = value;
    seen[field] = 1;
    return 1;
}

int main(int argc, char **argv)
{
    const char *family_name = NULL;
    const char *assignments[SNEPPX_MAX_KEY_FIELDS * 2];
    int assignment_count = 0;
    const struct sneppx_target *target = NULL;
    const char *target_option = NULL;
    sneppx_jit_stage stage = SNEPPX_JIT_STAGE_OPTIMIZED;
    const char *passes = NULL;
    int print_key = 0;
    for (int i = 1; i < argc; i++) {
        const char *option = argv[i];
        if (strcmp(option, "--help") == 0 || strcmp(option, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(option, "--print-key") == 0) {
            print_key = 1;
            continue;
        }
        if (strcmp(option, "--list-targets") == 0) {
            list_targets();
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "sneppx-ir: %s needs an argument\n", sneppx_clip(option).text);
            usage(stderr);
            return 2;
        }
        const char *argument = argv[++i];
        if (strcmp(option, "--family") == 0) {
            family_name = argument;
        } else if (strcmp(option, "--value") == 0) {
            /* No family has this many fields: some are unknown or given twice, which
             * parse_value names once the family is known. */
            if (assignment_count == (int)(sizeof assignments / sizeof assignments[0])) {
                fprintf(stderr, "sneppx-ir: --value %s: more than %d --value options\n", sneppx_clip(argument).text,
                        assignment_count);
                return 2;
            }
            assignments[assignment_count++] = argument;
        } else if (strcmp(option, "--target") == 0 || strcmp(option, "--vector-width") == 0) {
            if (target_option) {
                fprintf(stderr, "sneppx-ir: %s and %s both pick the target; give one\n", target_option, option);
                return 2;
            }
            target_option = option;
            target = option[2] == 't' ? parse_target(argument) : parse_vector_width(argument);
            if (!target)
                return 2;
        } else if (strcmp(option, "--stage") == 0 && strcmp(argument, "specialized") == 0) {
            stage = SNEPPX_JIT_STAGE_SPECIALIZED;
        } else if (strcmp(option, "--stage") == 0 && strcmp(argument, "optimized") == 0) {
            stage = SNEPPX_JIT_STAGE_OPTIMIZED;
        } else if (strcmp(option, "--passes") == 0) {
            /* LLVM's error for a pipeline it cannot parse quotes the pipeline, past our
             * clipping: a control character there would reach the terminal raw. */
            if (sneppx_has_control(argument)) {
                fprintf(stderr, "sneppx-ir: --passes %s: a control character is no part of a pipeline\n",
                        sneppx_clip(argument).text);
                return 2;
            }
            passes = argument;
        } else {
            fprintf(stderr, "sneppx-ir: unexpected %s %s\n", sneppx_clip(option).text, sneppx_clip(argument).text);
            usage(stderr);
            return 2;
        }
    }
    if (!family_name) {
        usage(stderr);
        return 2;
    }
    const struct sneppx_kernel_family *family = sneppx_kernel_family_find(family_name);
    if (!family) {
        fprintf(stderr, "sneppx-ir: '%s' is not a kernel family; one of:", sneppx_clip(family_name).text);
        for (int i = 0; i < sneppx_kernel_family_count; i++)
            fprintf(stderr, " %s", sneppx_kernel_families[i].family);
        fputc('\n', stderr);
        return 2;
    }
    int64_t values[SNEPPX_MAX_KEY_FIELDS] = {0};
    int seen[SNEPPX_MAX_KEY_FIELDS] = {0};
    for (int i = 0; i < assignment_count; i++)
        if (!parse_value(family, assignments[i], values, seen))
            return 2;
    /* A target narrower than the host's runs on the host's features narrowed to it
     * (SNEPPX_TARGET, runtime/host.c): so is its IR here, not on the wider ones. */
    if (target)
        sneppx_host_request_target(target, target_option);
    else
        target = sneppx_host_target();
    /* A GEMM's kc and mc not given are the target's defaults for its weight type. */
    const int weight_type = field_index(family, "weight_type", 11), kc = field_index(family, "kc", 2),
              mc = field_index(family, "mc", 2);
    if (strcmp(family->family, "gemm") == 0 && weight_type >= 0 && kc >= 0 && mc >= 0 && seen[weight_type] &&
        !seen[kc] && !seen[mc]) {
        sneppx_gemm_default_tiles(target, (sneppx_dtype)values[weight_type], &values[kc], &values[mc]);
        seen[kc] = seen[mc] = 1;
    }
    for (int i = 0; i < family->field_count; i++)
        if (!seen[i]) {
            fprintf(stderr, "sneppx-ir: %s needs --value %s=...\n", family->family, family->field_names[i]);
            return 2;
        }

    if (print_key) {
        char key[SNEPPX_KEY_MAX];
        sneppx_status status = sneppx_kernel_key(family->family, values, target, key, sizeof key);
        if (status != SNEPPX_OK) {
            fprintf(stderr, "sneppx-ir: %s: %s\n", sneppx_status_name(status), sneppx_last_error());
            return 1;
        }
        puts(key);
        return 0;
    }
    char *ir = NULL;
    sneppx_status status = sneppx_jit_module_ir(family, values, target, stage, passes, &ir);
    if (status != SNEPPX_OK) {
        fprintf(stderr, "sneppx-ir: %s: %s\n", sneppx_status_name(status), sneppx_last_error());
        return 1;
    }
    fputs(ir, stdout);
    free(ir);
    return 0;
}
