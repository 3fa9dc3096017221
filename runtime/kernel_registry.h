/* Internal: the kernel registry, a leaf module. The family table (key fields
 * with their legal values, entry points), the target table and the embedded
 * JIT bitcode are rendered at build time by `sneppx-gen build kernel-table`
 * from gen/sneppx_gen/kernels.py and targets.py into
 * build/generated/kernel_registry_table.c;
 * runtime/kernel_registry.c looks them up and formats and checks keys. */
#ifndef SNEPPX_RUNTIME_KERNEL_REGISTRY_H
#define SNEPPX_RUNTIME_KERNEL_REGISTRY_H
#include <stddef.h>
#include <stdint.h>
#include "sneppx/status.h"
#include "sneppx_abi.h"

#define SNEPPX_MAX_KEY_FIELDS 8

#define SNEPPX_KEY_MAX 160

/* The most candidates of one tile a target lists (targets.py). */
#define SNEPPX_MAX_TILE_CANDIDATES 8

struct sneppx_kernel_family {
    const char *family;                                 /* "attn_flash" */
    int field_count;
    const char *field_names[SNEPPX_MAX_KEY_FIELDS];     /* global spec_<name> in the bitcode */
    const char *field_prefixes[SNEPPX_MAX_KEY_FIELDS];  /* "d", "dv", ... */
    const char *const *field_choices[SNEPPX_MAX_KEY_FIELDS]; /* NULL or names by value */
    /* Legal values: min..max, multiples of `multiple` (a choice field: 0..choices-1). */
    int64_t field_min[SNEPPX_MAX_KEY_FIELDS];
    int64_t field_max[SNEPPX_MAX_KEY_FIELDS];
    int64_t field_multiple[SNEPPX_MAX_KEY_FIELDS];
    int entry_count;
    const char *entry_suffixes[SNEPPX_ENTRY_COUNT];     /* by SNEPPX_ENTRY_*: "" and "_pack" */
    const char *jit_pipeline;                           /* the LLVM passes the JIT runs: "default<O2>" */
    const char *jit_pipeline_summary;                   /* for people: "default<O2> pared to 43 passes" */
};

/* An instruction-set target kernels are built for (gen/sneppx_gen/targets.py
 * says why each tile); sneppx_targets lists them in order of preference, the
 * last requiring nothing. Internal APIs name a target by a pointer into it;
 * its vector width is a property, not its identity (targets may share one).
 * Its GEMM kernels' tiles that callers need are here, not derived from the width. */
struct sneppx_target {
    const char *name;                   /* the suffix of its keys, "v16" */
    int vector_width;                   /* floats per vector */
    const char *const *features;        /* LLVM host features it requires, "+avx512f"; NULL-terminated */
    int gemm_mr;                        /* rows of the register tile: GEMM tasks are whole MR-row tiles */
    int gemm_nr;                        /* columns of a packed weight panel (sneppx_gemm_packed_floats) */
    /* The GEMM key's cache blocking (its kc and mc fields) without a tuning
     * record: the k slice, and the block's rows for float32 / 16-bit and int8 panels. */
    int gemm_kc, gemm_mc, gemm_int8_mc;
    /* What a host's tuning times (runtime/gemm_tuner.c), each kc with each mc. */
    int gemm_kc_candidate_count, gemm_mc_candidate_count;
    int gemm_kc_candidates[SNEPPX_MAX_TILE_CANDIDATES];
    int gemm_mc_candidates[SNEPPX_MAX_TILE_CANDIDATES];
    /* attn_decode reads an int8 cache by integer dot products (queries and probabilities
     * rounded to int16), not in float arithmetic. */
    int decode_int8_dot;
};

struct sneppx_embedded_bitcode {
    const char *family;
    const struct sneppx_target *target; /* into sneppx_targets */
    const unsigned char *data;
    size_t size;
    const char *sha256_hex;   /* of data; part of every cache fingerprint */
};

extern const struct sneppx_kernel_family sneppx_kernel_families[];
extern const int sneppx_kernel_family_count;
extern const struct sneppx_target sneppx_targets[];
extern const int sneppx_target_count;
extern const struct sneppx_embedded_bitcode sneppx_embedded_bitcodes[];
extern const int sneppx_embedded_bitcode_count;

/* The family named name, or NULL. */
const struct sneppx_kernel_family *sneppx_kernel_family_find(const char *name);

/* The target called name ("v16"), or NULL. */
const struct sneppx_target *sneppx_target_named(const char *name);

/* The embedded bitcode of family for target, or NULL. */
const struct sneppx_embedded_bitcode *sneppx_kernel_bitcode_find(const char *family,
                                                                 const struct sneppx_target *target);

/* OK if value is legal for field `field` of the family; else
 * SNEPPX_ERR_INVALID_ARGUMENT naming the field, the family and the range. */
sneppx_status sneppx_kernel_check_value(const struct sneppx_kernel_family *family, int field, int64_t value);

/* Checks every value, then formats the canonical key of family/values/target
 * into key (at most key_size bytes, SNEPPX_KEY_MAX suffices). */
sneppx_status sneppx_kernel_key(const char *family, const int64_t *values, const struct sneppx_target *target,
                                char *key, size_t key_size);

/* The family and target of a key's text, `<family>-...-<target name>`
 * (the fields are not checked); SNEPPX_ERR_INVALID_ARGUMENT for other text. */
sneppx_status sneppx_kernel_key_parse(const char *key, char *family, size_t family_size,
                                      const struct sneppx_target **target);

#endif
