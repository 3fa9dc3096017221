/* HF config.json -> sneppx_config (include/sneppx/config.h): the attention
 * fields of the model types of gen/sneppx_gen/model_types.py (its rendered
 * table: model_types.h), and the rope_scaling keys of config_fields.py (the
 * table of config_internal.h). The one reader
 * of config.json: Python's LLMConfig.from_config_json calls it too, and the
 * constructor's rope_scaling dict is read by its rope_scaling reader
 * (sneppx_rope_scaling_from_json).
 * The text comes from outside (a downloaded checkpoint): every field read is
 * type-checked, and an error names the field. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config_internal.h"
#include "error.h"
#include "json_text.h"
#include "model_types.h"
#include "regular_file.h"
#include "sneppx/config.h"

/* Published config.json files are a few KiB; the bound keeps a hostile input
 * from making cJSON build an arbitrarily large tree. */
#define CONFIG_JSON_MAX_BYTES ((size_t)16 << 20)
/* JSON numbers are doubles: larger integers are not exact. */
#define JSON_EXACT_INT_MAX 9007199254740992.0

/* One JSON object being read; prefix names it in messages ("", "rope_scaling.", "rope_parameters."). */
struct scope {
    const cJSON *object;
    const char *prefix;
};

/* "a string", "-3", "true", ...: what a field held, for messages. */
static void describe(const cJSON *item, char *text, size_t size)
{
    if (cJSON_IsNumber(item))
        snprintf(text, size, "%.17g", item->valuedouble);
    else if (cJSON_IsTrue(item))
        snprintf(text, size, "true");
    else if (cJSON_IsFalse(item))
        snprintf(text, size, "false");
    else if (cJSON_IsString(item))
        snprintf(text, size, "the string \"%s\"", sneppx_clip_to(item->valuestring, 32).text);
    else if (cJSON_IsArray(item))
        snprintf(text, size, "an array");
    else if (cJSON_IsObject(item))
        snprintf(text, size, "an object");
    else
        snprintf(text, size, "null");
}

static sneppx_status format_error(const struct scope *scope, const char *key, const char *what, const cJSON *got)
{
    char held[96];
    describe(got, held, sizeof held);
    return sneppx_fail(SNEPPX_ERR_FORMAT, "config.json: %s%s: expected %s, got %s", scope->prefix, key, what,
                       held);
}

/* The member key of the scope, or NULL when absent or null (HF: None means
 * "use the default"). A key given twice is an error: JSON parsers disagree on
 * which one wins, so the file means different things to different readers. */
static sneppx_status lookup(const struct scope *scope, const char *key, const cJSON **value)
{
    const cJSON *found = NULL, *item;
    int count = 0;
    *value = NULL;
    cJSON_ArrayForEach(item, scope->object) {
        if (item->string && strcmp(item->string, key) == 0) {
            found = item;
            count++;
        }
    }
    if (count > 1)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "config.json: %s%s: appears %d times", scope->prefix, key, count);
    *value = found && !cJSON_IsNull(found) ? found : NULL;
    return SNEPPX_OK;
}

/* An integer-valued JSON number within the exact range of doubles. */
static int is_integer(const cJSON *item)
{
    return cJSON_IsNumber(item) && fabs(item->valuedouble) <= JSON_EXACT_INT_MAX &&
           item->valuedouble == floor(item->valuedouble);
}

/* A size: a non-negative integer; absent = fallback. */
static sneppx_status read_size(const struct scope *scope, const char *key, int64_t fallback, int64_t *out)
{
    const cJSON *item;
    sneppx_status status = lookup(scope, key, &item);
    if (status != SNEPPX_OK)
        return status;
    if (!item) {
        *out = fallback;
        return SNEPPX_OK;
    }
    if (!is_integer(item) || item->valuedouble < 0)
        return format_error(scope, key, "a non-negative integer", item);
    *out = (int64_t)item->valuedouble;
    return SNEPPX_OK;
}

/* 1 when the scope has no member key at all (a null member is there: transformers' config
 * classes take it as None, which is not always their default). */
static int absent(const struct scope *scope, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(scope->object, key) == NULL;
}

/* A size that must be present. */
static sneppx_status read_required_size(const struct scope *scope, const char *key, int64_t *out)
{
    const cJSON *item;
    sneppx_status status = lookup(scope, key, &item);
    if (status != SNEPPX_OK)
        return status;
    if (!item)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "config.json: %s%s: missing", scope->prefix, key);
    return read_size(scope, key, 0, out);
}

/* A finite number (JSON booleans are not numbers); absent = fallback. */
static sneppx_status read_real(const struct scope *scope, const char *key, double fallback, double *out)
{
    const cJSON *item;
    sneppx_status status = lookup(scope, key, &item);
    if (status != SNEPPX_OK)
        return status;
    if (!item) {
        *out = fallback;
        return SNEPPX_OK;
    }
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble)) /* cJSON reads 1e999 as inf */
        return format_error(scope, key, "a finite number", item);
    *out = item->valuedouble;
    return SNEPPX_OK;
}

/* true / false; absent = fallback. */
static sneppx_status read_flag(const struct scope *scope, const char *key, int fallback, int *out)
{
    const cJSON *item;
    sneppx_status status = lookup(scope, key, &item);
    if (status != SNEPPX_OK)
        return status;
    if (!item) {
        *out = fallback;
        return SNEPPX_OK;
    }
    if (!cJSON_IsBool(item))
        return format_error(scope, key, "true or false", item);
    *out = cJSON_IsTrue(item) ? 1 : 0;
    return SNEPPX_OK;
}

/* A string; absent = NULL. */
static sneppx_status read_string(const struct scope *scope, const char *key, const char **out)
{
    const cJSON *item;
    sneppx_status status = lookup(scope, key, &item);
    if (status != SNEPPX_OK)
        return status;
    *out = NULL;
    if (!item)
        return SNEPPX_OK;
    if (!cJSON_IsString(item))
        return format_error(scope, key, "a string", item);
    *out = item->valuestring;
    return SNEPPX_OK;
}

/* ---- rope_scaling --------------------------------------------------------- */

/* The dict's keys: "rope_type" (or "type"), the parameters, and "truncate". */
static int rope_key_known(const char *key)
{
    if (strcmp(key, "rope_type") == 0 || strcmp(key, "type") == 0 || strcmp(key, "truncate") == 0)
        return 1;
    for (int i = 0; i < sneppx_rope_field_count; i++)
        if (strcmp(sneppx_rope_fields[i].name, key) == 0)
            return 1;
    return 0;
}

/* The rope type the dict names: "rope_type" (newer HF) or "type" (older, DeepSeek);
 * ROPE_KIND_MISSING when it names none. */
enum { ROPE_KIND_MISSING = -1 };
static sneppx_status rope_kind(const struct scope *scope, int *kind)
{
    const char *rope_type, *type;
    sneppx_status status = read_string(scope, "rope_type", &rope_type);
    if (status == SNEPPX_OK)
        status = read_string(scope, "type", &type);
    if (status != SNEPPX_OK)
        return status;
    if (rope_type && type && strcmp(rope_type, type) != 0)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "config.json: %.*s: rope_type '%s' and type '%s' disagree",
                           (int)strlen(scope->prefix) - 1, scope->prefix, sneppx_clip(rope_type).text, sneppx_clip(type).text);
    const char *name = rope_type ? rope_type : type;
    if (!name) {
        *kind = ROPE_KIND_MISSING;
        return SNEPPX_OK;
    }
    for (int i = 0; i < sneppx_rope_type_count; i++) {
        if (strcmp(sneppx_rope_type_names[i], name) == 0) {
            *kind = i;
            return SNEPPX_OK;
        }
    }
    return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "config.json: %srope_type: '%s' is not supported (supported: %s)",
                       scope->prefix, sneppx_clip(name).text, sneppx_rope_type_list);
}

/* Keys each rope type requires (HF's rope validation asks for the same). */
static sneppx_status check_required_rope_keys(const struct scope *scope, int kind)
{
    for (int i = 0; i < sneppx_rope_field_count; i++) {
        const char *key = sneppx_rope_fields[i].name;
        const cJSON *item;
        if (!(sneppx_rope_fields[i].required_by & (1u << kind)))
            continue;
        sneppx_status status = lookup(scope, key, &item);
        if (status != SNEPPX_OK)
            return status;
        if (!item)
            return sneppx_fail(SNEPPX_ERR_FORMAT, "config.json: %s%s: missing (rope_type '%s' needs it)",
                               scope->prefix, key, sneppx_rope_type_names[kind]);
    }
    return SNEPPX_OK;
}

/* One parameter of a dict of type kind: a finite number or an integer, as the
 * field is; absent, the table's value for the type. */
static sneppx_status read_rope_parameter(const struct scope *scope, const struct sneppx_rope_field *f, int kind,
                                         sneppx_rope_scaling *scaling)
{
    char *at = (char *)scaling + f->offset;
    if (f->real) {
        double value = 0.0; /* set by read_real (gcc cannot tell once it inlines it) */
        sneppx_status status = read_real(scope, f->name, f->absent[kind], &value);
        if (status == SNEPPX_OK)
            memcpy(at, &value, sizeof value);
        return status;
    }
    const cJSON *item;
    sneppx_status status = lookup(scope, f->name, &item);
    if (status != SNEPPX_OK)
        return status;
    if (item && !is_integer(item))
        return format_error(scope, f->name, "an integer", item);
    const int64_t value = item ? (int64_t)item->valuedouble : (int64_t)f->absent[kind];
    memcpy(at, &value, sizeof value);
    return SNEPPX_OK;
}

/* The keys of transformers 5's rope_parameters that are not rope_scaling's: they are
 * read beside it (read_rope), as the top-level keys of older files. */
static int rope_config_key(const char *key)
{
    return strcmp(key, "rope_theta") == 0 || strcmp(key, "partial_rotary_factor") == 0;
}

/* HF's rope_scaling value: an object, or NULL (absent or null) for plain RoPE.
 * name is the key that held it, for messages ("rope_scaling", or "rope_parameters",
 * whose rope_theta and partial_rotary_factor keys the caller reads). */
static sneppx_status read_rope_scaling_value(const cJSON *dict, const char *name, sneppx_rope_scaling *scaling)
{
    const struct scope top = {NULL, ""};
    const int parameters = strcmp(name, "rope_parameters") == 0;
    char prefix[32];
    sneppx_status status;
    scaling->type = SNEPPX_ROPE_DEFAULT;
    scaling->factor = 1.0;
    if (!dict)
        return SNEPPX_OK;
    if (!cJSON_IsObject(dict))
        return format_error(&top, name, "an object or null", dict);

    snprintf(prefix, sizeof prefix, "%s.", name);
    const struct scope scope = {dict, prefix};
    /* A type given but not supported first: its own keys (longrope's long_factor) would
     * otherwise be named as unknown. A missing type comes after the keys: a per-layer
     * dict ({"full_attention": {...}}) is named by its unknown key. */
    int kind = SNEPPX_ROPE_DEFAULT;
    const sneppx_status type_status = rope_kind(&scope, &kind);
    if (type_status == SNEPPX_ERR_UNSUPPORTED)
        return type_status;
    const cJSON *item;
    cJSON_ArrayForEach(item, dict) {
        if (!item->string || !(rope_key_known(item->string) || (parameters && rope_config_key(item->string))))
            return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "config.json: %s.%s: unknown key (known: %s%s)", name,
                               sneppx_clip(item->string ? item->string : "").text, sneppx_rope_key_list,
                               parameters ? ", rope_theta, partial_rotary_factor" : "");
    }
    if (type_status != SNEPPX_OK)
        return type_status;
    if (kind == ROPE_KIND_MISSING) {
        /* transformers 5 reads a dict without a type as plain RoPE: so is one that holds
         * nothing else ({}, nulls, or rope_parameters' own rope_theta). A scaling parameter
         * without a type is refused: its type cannot be guessed. */
        cJSON_ArrayForEach(item, dict) {
            if (!cJSON_IsNull(item) && !rope_config_key(item->string))
                return sneppx_fail(SNEPPX_ERR_FORMAT,
                                   "config.json: %s.rope_type: missing (nor is 'type' given), which '%s' needs", name,
                                   sneppx_clip(item->string).text);
        }
        return SNEPPX_OK;
    }
    if ((status = check_required_rope_keys(&scope, kind)) != SNEPPX_OK)
        return status;
    /* YaRN without floor/ceil of the correction range is not implemented;
     * like HF, only an absent or true "truncate" means floor/ceil. */
    const cJSON *truncate;
    if ((status = lookup(&scope, "truncate", &truncate)) != SNEPPX_OK)
        return status;
    if (cJSON_GetObjectItemCaseSensitive(dict, "truncate") && !cJSON_IsTrue(truncate))
        return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "config.json: %s.truncate: only true (YaRN with "
                           "floor/ceil of the correction range) is supported", name);

    /* The real-valued parameters, then the integers (the order of the messages when several are wrong). */
    for (int real = 1; real >= 0; real--)
        for (int i = 0; i < sneppx_rope_field_count; i++)
            if (sneppx_rope_fields[i].real == real &&
                (status = read_rope_parameter(&scope, &sneppx_rope_fields[i], kind, scaling)) != SNEPPX_OK)
                return status;
    scaling->type = (sneppx_rope_type)kind;
    return SNEPPX_OK;
}

/* rope_theta, the scaling, and the partial_rotary_factor item (NULL when absent) that
 * refuse_partial_scaled_rope judges. transformers 5 saves all three in one
 * "rope_parameters" object and none at the top, older files at the top (rope_scaling).
 * As transformers reads them: a non-null, non-empty rope_scaling is taken in place of
 * rope_parameters, and the dict's rope_theta and partial_rotary_factor win over the
 * top-level ones. */
static sneppx_status read_rope(const struct scope *top, sneppx_config *config, const cJSON **partial)
{
    const cJSON *scaling, *parameters;
    sneppx_status status;
    if ((status = lookup(top, "rope_scaling", &scaling)) != SNEPPX_OK ||
        (status = lookup(top, "rope_parameters", &parameters)) != SNEPPX_OK ||
        (status = read_real(top, "rope_theta", config->rope_theta, &config->rope_theta)) != SNEPPX_OK ||
        (status = lookup(top, "partial_rotary_factor", partial)) != SNEPPX_OK)
        return status;
    /* transformers takes `rope_scaling or rope_parameters`: an empty rope_scaling is none. */
    if (scaling && cJSON_IsObject(scaling) && !scaling->child && parameters)
        scaling = NULL;
    if (scaling || !parameters)
        return read_rope_scaling_value(scaling, "rope_scaling", &config->rope_scaling);
    if ((status = read_rope_scaling_value(parameters, "rope_parameters", &config->rope_scaling)) != SNEPPX_OK)
        return status;
    const struct scope inner = {parameters, "rope_parameters."};
    const cJSON *inner_partial;
    if ((status = read_real(&inner, "rope_theta", config->rope_theta, &config->rope_theta)) != SNEPPX_OK ||
        (status = lookup(&inner, "partial_rotary_factor", &inner_partial)) != SNEPPX_OK)
        return status;
    if (inner_partial)
        *partial = inner_partial;
    return SNEPPX_OK;
}

/* ---- the model ------------------------------------------------------------------ */

static sneppx_status read_model_type(const struct scope *top, const struct sneppx_model_type **type)
{
    const char *name;
    sneppx_status status = read_string(top, "model_type", &name);
    if (status != SNEPPX_OK)
        return status;
    if (!name)
        return sneppx_fail(SNEPPX_ERR_FORMAT, "config.json: model_type: missing");
    for (int i = 0; i < sneppx_model_type_count; i++) {
        if (strcmp(sneppx_model_types[i].name, name) == 0) {
            *type = &sneppx_model_types[i];
            return SNEPPX_OK;
        }
    }
    return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "config.json: model_type: '%s' is not supported (supported: %s)",
                       sneppx_clip(name).text, sneppx_model_type_list);
}

/* Whether a Qwen2 file with use_sliding_window: true slides on any layer, by
 * Qwen2Config's rule: its layer_types when given, else the layers from
 * max_window_layers (default 28) of num_hidden_layers (default 32), and none
 * without a sliding_window (a null one; absent is 4096). Files whose layers are
 * all full attention run plainly causal in transformers. */
static sneppx_status qwen2_slides(const struct scope *top, int *slides)
{
    const cJSON *types, *window, *item;
    int64_t layers = 0, first_window = 0;
    sneppx_status status;
    *slides = 0;
    if ((status = lookup(top, "layer_types", &types)) != SNEPPX_OK)
        return status;
    if (types) {
        if (!cJSON_IsArray(types))
            return format_error(top, "layer_types", "an array of strings", types);
        cJSON_ArrayForEach(item, types) {
            if (!cJSON_IsString(item))
                return format_error(top, "layer_types", "an array of strings", item);
            if (strcmp(item->valuestring, "full_attention") != 0)
                *slides = 1;
        }
        return SNEPPX_OK;
    }
    if ((status = lookup(top, "sliding_window", &window)) != SNEPPX_OK ||
        (status = read_size(top, "num_hidden_layers", 32, &layers)) != SNEPPX_OK ||
        (status = read_size(top, "max_window_layers", 28, &first_window)) != SNEPPX_OK)
        return status;
    *slides = (window || !cJSON_GetObjectItemCaseSensitive(top->object, "sliding_window")) && layers > first_window;
    return SNEPPX_OK;
}

/* Biases and windows differ per model type (docs/MODELS.md section 7). */
static sneppx_status read_family_fields(const struct scope *top, const struct sneppx_model_type *type,
                                        sneppx_config *config)
{
    sneppx_status status = SNEPPX_OK;
    switch (type->bias) {
    case SNEPPX_MODEL_BIAS_ATTENTION_BIAS: /* q/k/v and o together (default false) */
        status = read_flag(top, "attention_bias", 0, &config->qkv_bias);
        config->o_bias = config->qkv_bias;
        break;
    case SNEPPX_MODEL_BIAS_NONE:
        config->qkv_bias = config->o_bias = 0;
        break;
    case SNEPPX_MODEL_BIAS_QKV: /* Qwen2: q/k/v bias hard-coded in Qwen2Attention, o_proj none */
        config->qkv_bias = 1;
        config->o_bias = 0;
        break;
    }
    if (status != SNEPPX_OK)
        return status;
    if (type->window == SNEPPX_MODEL_WINDOW_SLIDING_WINDOW) {
        /* Absent: the class's default (Mistral's 4096); null: no window. */
        status = read_size(top, "sliding_window", absent(top, "sliding_window") ? type->default_window : 0,
                           &config->sliding_window);
    } else if (type->window == SNEPPX_MODEL_WINDOW_USE_SLIDING_WINDOW) {
        int windowed = 0, slides = 0;
        if ((status = read_flag(top, "use_sliding_window", 0, &windowed)) == SNEPPX_OK && windowed &&
            (status = qwen2_slides(top, &slides)) == SNEPPX_OK && slides)
            status = sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "config.json: use_sliding_window: true (Qwen2 per-layer "
                                 "windows) is not supported");
    }
    if (status != SNEPPX_OK || !type->mla)
        return status;
    /* MLA: without kv_lora_rank the file would silently become a plain layer. */
    /* Absent: DeepseekV2Config's 1536 (q_a_proj, q_b_proj); null: 0, the plain q_proj. */
    if ((status = read_size(top, "q_lora_rank", absent(top, "q_lora_rank") ? type->default_q_lora_rank : 0,
                            &config->q_lora_rank)) != SNEPPX_OK ||
        (status = read_required_size(top, "kv_lora_rank", &config->kv_lora_rank)) != SNEPPX_OK ||
        (status = read_required_size(top, "qk_nope_head_dim", &config->qk_nope_head_dim)) != SNEPPX_OK ||
        (status = read_required_size(top, "qk_rope_head_dim", &config->qk_rope_head_dim)) != SNEPPX_OK ||
        (status = read_required_size(top, "v_head_dim", &config->v_head_dim)) != SNEPPX_OK)
        return status;
    config->rope_interleaved = 1; /* the published weights rotate (x_2i, x_2i+1) pairs (docs/MODELS.md section 3) */
    return SNEPPX_OK;
}

/* partial_rotary_factor is not read: transformers' LLaMA, Mistral and Qwen2 attention
 * rotates the whole head whatever it says (their default RoPE never reads it). With a
 * scaled RoPE type transformers fails on it (those frequencies cover only that part of the
 * head), so such a file is refused rather than run as a model transformers cannot. */
static sneppx_status refuse_partial_scaled_rope(const cJSON *item, const sneppx_config *config)
{
    if (!item || !cJSON_IsNumber(item) || item->valuedouble == 1.0 || config->rope_scaling.type == SNEPPX_ROPE_DEFAULT)
        return SNEPPX_OK;
    return sneppx_fail(SNEPPX_ERR_UNSUPPORTED, "config.json: partial_rotary_factor: %g with rope_scaling '%s' is not "
                       "supported (transformers cannot run it: that RoPE covers part of each head, its attention "
                       "the whole head)", item->valuedouble, sneppx_rope_type_names[config->rope_scaling.type]);
}

static sneppx_status read_config(const cJSON *root, sneppx_config *config)
{
    const struct scope top = {root, ""};
    const struct sneppx_model_type *type = NULL;
    const cJSON *partial = NULL;
    sneppx_status status;
    if ((status = read_model_type(&top, &type)) != SNEPPX_OK ||
        (status = read_required_size(&top, "hidden_size", &config->hidden_size)) != SNEPPX_OK ||
        (status = read_required_size(&top, "num_attention_heads", &config->num_attention_heads)) != SNEPPX_OK ||
        /* Absent: the class's default (Mistral's 8, Qwen2's 32), else, as null, num_attention_heads. */
        (status = read_size(&top, "num_key_value_heads",
                            type->default_kv_heads > 0 && absent(&top, "num_key_value_heads")
                                ? type->default_kv_heads
                                : config->num_attention_heads,
                            &config->num_key_value_heads)) != SNEPPX_OK ||
        (status = read_rope(&top, config, &partial)) != SNEPPX_OK ||
        (status = read_size(&top, "max_position_embeddings", type->default_max_positions,
                            &config->max_position_embeddings)) != SNEPPX_OK)
        return status;
    snprintf(config->name, sizeof config->name, "%s", type->name);
    /* DeepSeek's head dims are the MLA fields; its head_dim is not read. */
    if (!type->mla && ((status = read_size(&top, "head_dim", 0, &config->head_dim)) != SNEPPX_OK ||
                       (status = refuse_partial_scaled_rope(partial, config)) != SNEPPX_OK))
        return status;
    return read_family_fields(&top, type, config);
}

/* The JSON value of length bytes of text (any value: the callers check its
 * kind); NULL with the error set when the text is not JSON. */
static sneppx_status parse_json(const char *json_text, size_t length, cJSON **root)
{
    *root = NULL;
    if (length > CONFIG_JSON_MAX_BYTES)
        /* Files are read only one byte past the bound, so their length says only "more". */
        return sneppx_fail(SNEPPX_ERR_FORMAT, "json_text: more than %zu bytes, the most a config.json may have",
                           CONFIG_JSON_MAX_BYTES);
    /* A NUL-terminated copy: the parser then never depends on the caller's
     * buffer ending where length says. */
    char *text = malloc(length + 1);
    if (!text)
        return sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "json_text: out of memory copying %zu bytes", length);
    memcpy(text, json_text, length);
    text[length] = '\0';
    const char *end = NULL;
    const size_t bad_text = sneppx_json_bad_text(text, length);
    cJSON *parsed = bad_text < length ? NULL : cJSON_ParseWithLengthOpts(text, length, &end, 0);
    sneppx_status status = SNEPPX_OK;
    if (bad_text < length) {
        status = sneppx_fail(SNEPPX_ERR_FORMAT,
                             "json_text: not valid JSON, or a NUL in a string (at byte %zu: " SNEPPX_JSON_BAD_TEXT ")",
                             bad_text);
    } else if (!parsed) {
        status = sneppx_fail(SNEPPX_ERR_FORMAT, "json_text: not valid JSON (at byte %zu)",
                             end && end >= text ? (size_t)(end - text) : (size_t)0);
    } else {
        for (const char *p = end; p && p < text + length; p++) {
            if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') {
                status = sneppx_fail(SNEPPX_ERR_FORMAT, "json_text: bytes after the JSON object (at byte %zu)",
                                     (size_t)(p - text));
                break;
            }
        }
    }
    free(text);
    if (status != SNEPPX_OK)
        cJSON_Delete(parsed);
    else
        *root = parsed;
    return status;
}

sneppx_status sneppx_config_from_json(const char *json_text, size_t length, sneppx_config *config)
{
    sneppx_clear_error();
    if (!json_text)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "json_text: must not be NULL");
    if (!config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    cJSON *root = NULL;
    sneppx_status status = parse_json(json_text, length, &root);
    if (status == SNEPPX_OK && !cJSON_IsObject(root))
        status = sneppx_fail(SNEPPX_ERR_FORMAT, "json_text: not a JSON object");
    sneppx_config parsed;
    sneppx_config_init(&parsed);
    if (status == SNEPPX_OK)
        status = read_config(root, &parsed);
    cJSON_Delete(root);
    if (status == SNEPPX_OK)
        status = sneppx_config_validate(&parsed);
    if (status == SNEPPX_OK)
        *config = parsed;
    return status;
}

sneppx_status sneppx_rope_scaling_from_json(const char *json_text, size_t length, sneppx_rope_scaling *scaling)
{
    sneppx_clear_error();
    if (!json_text)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "json_text: must not be NULL");
    if (!scaling)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "scaling: must not be NULL");
    cJSON *root = NULL;
    sneppx_status status = parse_json(json_text, length, &root);
    sneppx_rope_scaling parsed = sneppx_config_defaults.rope_scaling;
    if (status == SNEPPX_OK)
        status = read_rope_scaling_value(cJSON_IsNull(root) ? NULL : root, "rope_scaling", &parsed);
    cJSON_Delete(root);
    if (status == SNEPPX_OK) {
        *scaling = parsed;
    } else if (strncmp(sneppx_last_error(), "config.json: ", 13) == 0) {
        /* The value is not a file: its messages start at "rope_scaling". */
        char message[1024];
        snprintf(message, sizeof message, "%s", sneppx_last_error() + 13);
        sneppx_fail(status, "%s", message);
    }
    return status;
}

/* Reads at most CONFIG_JSON_MAX_BYTES + 1 bytes of a regular file (so an
 * oversized one is reported as such by sneppx_config_from_json). A FIFO,
 * device or socket is refused without waiting for a writer: opened with
 * O_NONBLOCK and checked by fstat, as the safetensors reader does. */
static char *read_config_file(const char *path, size_t *size, sneppx_status *status)
{
    struct stat st;
    int not_regular;
    int fd = sneppx_open_regular(path, &st, &not_regular);
    if (fd < 0) {
        *status = not_regular ? sneppx_fail(SNEPPX_ERR_IO, "%s: not a regular file", path)
                              : sneppx_fail(SNEPPX_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    const size_t capacity = CONFIG_JSON_MAX_BYTES + 1;
    char *text = malloc(capacity);
    if (!text) {
        close(fd);
        *status = sneppx_fail(SNEPPX_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        return NULL;
    }
    size_t got;
    if (sneppx_read_up_to(fd, 0, text, capacity, &got) != 0) {
        *status = sneppx_fail(SNEPPX_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        free(text);
        close(fd);
        return NULL;
    }
    close(fd);
    *size = got;
    return text;
}

sneppx_status sneppx_config_from_json_file(const char *path, sneppx_config *config)
{
    sneppx_clear_error();
    if (!path)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "path: must not be NULL");
    if (!config)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "config: must not be NULL");
    if (!path[0]) /* open() would fail with a message that names an empty file */
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "path: empty; give a config.json or the directory holding it");
    /* A checkpoint directory means its config.json. */
    char joined[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if ((size_t)snprintf(joined, sizeof joined, "%s/config.json", path) >= sizeof joined)
            return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "path: longer than %zu bytes", sizeof joined - 13);
        path = joined;
    }
    size_t size = 0;
    sneppx_status status = SNEPPX_OK;
    char *text = read_config_file(path, &size, &status);
    if (!text)
        return status;
    status = sneppx_config_from_json(text, size, config);
    free(text);
    if (status != SNEPPX_OK) {
        /* Its messages name the input "config.json: " or "json_text: "; name the file instead. */
        char message[1024];
        const char *reason = sneppx_last_error();
        if (strncmp(reason, "config.json: ", 13) == 0)
            reason += 13;
        else if (strncmp(reason, "json_text: ", 11) == 0)
            reason += 11;
        snprintf(message, sizeof message, "%s", reason);
        return sneppx_fail(status, "%s: %s", path, message);
    }
    return SNEPPX_OK;
}
