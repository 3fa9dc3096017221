/* Internal: quantities derived from a (validated) config. */
#ifndef SNEPPX_RUNTIME_CONFIG_INTERNAL_H
#define SNEPPX_RUNTIME_CONFIG_INTERNAL_H
#include <stddef.h>
#include "rope_freqs.h"
#include "sneppx/config.h"

/* sneppx_config_init()'s values: gen/sneppx_gen/config_fields.py's defaults,
 * rendered into config_fields.c with the check of the struct against that list. */
extern const sneppx_config sneppx_config_defaults;

/* config_fields.ROPE_TYPES, rendered beside it: HF's rope_type names by
 * sneppx_rope_type value, their count, and "default, linear, ..." for messages. */
extern const char *const sneppx_rope_type_names[];
extern const int sneppx_rope_type_count;
extern const char sneppx_rope_type_list[];

/* config_fields.DTYPES, rendered beside it: names and element sizes by
 * sneppx_dtype value, and "float32, bfloat16, float16" for messages. */
extern const char *const sneppx_dtype_names[];
extern const int sneppx_dtype_bytes[];
extern const char sneppx_dtype_list[];
/* config_fields.WEIGHT_DTYPES: the first sneppx_weight_dtype_count types, which weights take. */
extern const int sneppx_weight_dtype_count;
extern const char sneppx_weight_dtype_list[];

/* config_fields.ROPE_PARAMETERS (sneppx_rope_scaling's fields but type), rendered
 * beside them: how a rope_scaling dict gives each (runtime/config_json.c reads the
 * table), which sneppx_config_validate requires finite, and their copy into struct
 * sneppx_rope_params. */
struct sneppx_rope_field {
    const char *name;                        /* the dict's key */
    size_t offset;                           /* in sneppx_rope_scaling */
    int real;                                /* a double; else an int64_t */
    double absent[SNEPPX_ROPE_TYPE_COUNT];   /* the value a dict of each type lacking it gives */
    unsigned required_by;                    /* bit t set: a dict of type t must give it */
    int finite;                              /* sneppx_config_validate refuses a non-finite value */
};
_Static_assert(SNEPPX_ROPE_TYPE_COUNT <= 32, "sneppx_rope_field.required_by has a bit per RoPE type");
extern const struct sneppx_rope_field sneppx_rope_fields[];
extern const int sneppx_rope_field_count;
/* "rope_type, type, factor, ..., truncate": the keys a dict may hold, for messages. */
extern const char sneppx_rope_key_list[];
/* params->type and every parameter from scaling (the rest of params untouched). */
void sneppx_rope_params_set_scaling(struct sneppx_rope_params *params, const sneppx_rope_scaling *scaling);

/* config_fields.CONFIG_FIELDS value by value (rope_scaling's as "rope_scaling.<name>"),
 * rendered beside them: where each lives in sneppx_config and what it is (the two
 * enums are ints that differences name by their names). */
enum sneppx_field_kind {
    SNEPPX_FIELD_INT, SNEPPX_FIELD_ROPE_TYPE, SNEPPX_FIELD_DTYPE, SNEPPX_FIELD_INT64, SNEPPX_FIELD_DOUBLE,
    SNEPPX_FIELD_NAME
};
struct sneppx_config_field {
    const char *name;
    size_t offset;
    enum sneppx_field_kind kind;
};
extern const struct sneppx_config_field sneppx_config_fields[];
extern const int sneppx_config_field_count;

/* The first value (in field order) in which a and b differ, padding and the bytes after
 * name's NUL aside, skipping the field at offset skip[i] for each of the skip_count
 * offsets: 0 when none does, else 1 with "<field> <a's value> / <b's value>" in text
 * (runtime/config_compare.c). */
int sneppx_config_difference(const sneppx_config *a, const sneppx_config *b, const size_t *skip, int skip_count,
                             char *text, size_t size);

int64_t sneppx_config_head_dim(const sneppx_config *config);
int64_t sneppx_config_rotary_dim(const sneppx_config *config);
void sneppx_config_rope_params(const sneppx_config *config, struct sneppx_rope_params *params);

/* What follows "position_ids: position P is beyond max_position_embeddings M":
 * the two ways past it and which one is HF's. implicit_positions: the cached
 * forward made the positions (position_ids NULL). */
const char *sneppx_config_beyond_positions_hint(const sneppx_config *config, int implicit_positions);

#endif
