/* sneppx — attention configuration: presets and hand-built configs.
 *
 * Field names follow HuggingFace config.json. A config is plain data: fill it
 * by hand after sneppx_config_init(), or from a preset of the registry
 * (gen/archs.json) with sneppx_config_from_name(). */
#ifndef SNEPPX_CONFIG_H
#define SNEPPX_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "sneppx/export.h"
#include "sneppx/limits.h"
#include "sneppx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sneppx_rope_type {
    SNEPPX_ROPE_DEFAULT = 0, /* inv_freq[i] = theta^(-2i/d) */
    SNEPPX_ROPE_LINEAR = 1,  /* default / factor */
    SNEPPX_ROPE_DYNAMIC = 2, /* HF dynamic NTK: base grows once positions pass max_position_embeddings */
    SNEPPX_ROPE_LLAMA3 = 3,  /* Llama 3.1 frequency smoothing */
    SNEPPX_ROPE_YARN = 4,    /* DeepSeek V2 */
    SNEPPX_ROPE_TYPE_COUNT   /* how many there are (not a type) */
} sneppx_rope_type;

/* How the projections' weights are stored once packed (sneppx_config.weight_dtype).
 * Products accumulate in float32 whatever the type; biases and RMSNorm weights
 * stay float32. Values are fixed: a later type takes the next value. */
typedef enum sneppx_dtype {
    SNEPPX_DTYPE_FLOAT32 = 0,  /* as given (the default) */
    SNEPPX_DTYPE_BFLOAT16 = 1, /* rounded to nearest even at packing, NaN stays NaN: half the bytes */
    SNEPPX_DTYPE_FLOAT16 = 2,  /* IEEE binary16, rounded to nearest even, overflow to inf: half the bytes */
    SNEPPX_DTYPE_INT8 = 3,     /* symmetric int8 with float32 scales (max |x| / 127, q = the float32 quotient
                                  x / scale rounded to even, in [-127, 127]): weights, one scale per group
                                  of 32 input features of an output feature (9/32 of the bytes); the KV
                                  cache, one per row (kv_cache.h) */
    SNEPPX_DTYPE_COUNT         /* how many there are (not a type) */
} sneppx_dtype;

typedef struct sneppx_rope_scaling {
    sneppx_rope_type type;
    double factor;                          /* linear, dynamic, llama3, yarn */
    double low_freq_factor;                 /* llama3 */
    double high_freq_factor;                /* llama3 */
    int64_t original_max_position_embeddings; /* llama3, yarn (0 = max_position_embeddings) */
    double beta_fast, beta_slow;            /* yarn (0: YaRN's 32, 1; below 0 refused) */
    double mscale;                          /* yarn (0 = unset) */
    double mscale_all_dim;                  /* yarn; MLA's softmax scale beside any scaled type (0 = unset) */
    double attention_factor;                /* yarn: explicit cos/sin factor (0 = derive; below 0 refused) */
} sneppx_rope_scaling;

typedef struct sneppx_config {
    char name[SNEPPX_NAME_MAX];     /* "llama3-8B" for presets, "custom" otherwise; NUL-terminated,
                                       only A-Z a-z 0-9 . _ - (it reaches generated code and logs) */
    int64_t hidden_size;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;
    int64_t head_dim;               /* 0 = hidden_size / num_attention_heads */
    int64_t rotary_dim;             /* 0 = whole head (partial rotary if smaller); MLA: 0 or
                                       qk_rope_head_dim, the dims it rotates */
    int rope_interleaved;           /* 0 = HF rotate_half pairs (i, i+d/2); 1 = (2i, 2i+1): DeepSeek's
                                       weights need 1 (sneppx_config_from_json and the MLA presets
                                       set it; a hand-filled MLA config must too) */
    double rope_theta;
    sneppx_rope_scaling rope_scaling;
    int64_t max_position_embeddings;
    int64_t sliding_window;         /* 0 = none; else W keys including the query itself */
    int qkv_bias;                   /* 1 = q/k/v projections carry a bias (flags: 0 or 1) */
    int o_bias;                     /* o projection carries a bias */
    /* DeepSeek V2 multi-head latent attention; kv_lora_rank > 0 turns it on, and
     * without it these five fields must be 0 (a layer without MLA ignores them). */
    int64_t q_lora_rank;            /* 0 = plain q_proj */
    int64_t kv_lora_rank;
    int64_t qk_nope_head_dim;
    int64_t qk_rope_head_dim;
    int64_t v_head_dim;
    int mla_naive;                  /* 1 = expand kv_b_proj to per-head K/V (verification);
                                       MLA configs only */
    /* Execution */
    int use_flash_attn;             /* 1 = flash (default), 0 = materialized SDPA */
    int num_threads;                /* 0 = OpenMP default; at most SNEPPX_MAX_THREADS; every
                                       parallel region of the layer (creation, packing,
                                       RoPE tables, forwards) runs on this many */
    sneppx_dtype weight_dtype;      /* how the projections' weights are stored (default float32);
                                       a decode step reads half the bytes in bfloat16 / float16,
                                       9/32 in int8 */
    sneppx_dtype compute_dtype;     /* what the projections multiply in: float32 (default), or
                                       bfloat16, opt-in, with bfloat16 weights on AVX512_BF16
                                       hosts: activations rounded to bfloat16 (nearest even),
                                       products summed in float32 (vdpbf16ps, which
                                       reads and makes subnormals as 0), ~2x the rate where
                                       vdpbf16ps issues as often as an FMA (AMD Zen 4/5;
                                       0.7x on an Intel Xeon: docs/API.md) */
} sneppx_config;

/* A hand config with sneppx's defaults: bias on, flash on, default RoPE
 * theta 10000, no window. Sizes are zero and must be filled in. */
SNEPPX_API void sneppx_config_init(sneppx_config *config);

/* Preset by family and size, case-insensitive: ("llama3", "8B"), ("mistral", "7B").
 * size may be NULL when family is a full name: "mistral-7B", "deepseek-v2". */
SNEPPX_API sneppx_status sneppx_config_from_name(const char *family, const char *size,
                                                 sneppx_config *config);

/* The attention fields of a HuggingFace config.json, given as its text
 * (length bytes, no NUL needed), with the semantics of Python's
 * LLMConfig.from_config_json: model_type llama, mistral, qwen2 or deepseek_v2;
 * num_key_value_heads, head_dim, rope_theta, rope_scaling (rope_type or
 * type: default, linear, dynamic, llama3, yarn) or transformers 5's
 * rope_parameters (the same dict, holding rope_theta), max_position_embeddings
 * (default of the model type's transformers class when absent);
 * attention_bias (llama, deepseek_v2: q/k/v and o),
 * Qwen2's hard-coded q/k/v bias, Mistral's sliding_window; DeepSeek's MLA
 * fields (rope interleaved). partial_rotary_factor is not read (transformers'
 * attention of these types rotates the whole head), but refused beside a scaled
 * rope_scaling, which transformers cannot run (docs/MODELS.md). A JSON null
 * counts as absent, but where the config class's default is not None's meaning:
 * Mistral's sliding_window (absent 4096, null none) and Mistral's and Qwen2's
 * num_key_value_heads (absent 8 and 32, null num_attention_heads), DeepSeek's
 * q_lora_rank (absent 1536, null 0). name becomes
 * the model_type; execution fields keep
 * sneppx_config_init()'s values.
 * The result is validated. Errors name the field: SNEPPX_ERR_FORMAT for text
 * that is not JSON, a missing field or a field of the wrong type or sign;
 * SNEPPX_ERR_UNSUPPORTED for a model_type, rope type or option sneppx does
 * not run; config is written only on success. Thread-safe. */
SNEPPX_API sneppx_status sneppx_config_from_json(const char *json_text, size_t length, sneppx_config *config);

/* sneppx_config_from_json on the file at path (a directory: its config.json).
 * Only a regular file is read: a FIFO, device or socket is SNEPPX_ERR_IO at
 * once (opened non-blocking, as sneppx_safetensors_open does), as is a file
 * that cannot be opened or read; errors name the file. Thread-safe. */
SNEPPX_API sneppx_status sneppx_config_from_json_file(const char *path, sneppx_config *config);

/* HF's rope_scaling value alone, given as JSON text (an object, or null for
 * plain RoPE), read by the rules of sneppx_config_from_json: the keys, rope
 * types, required keys and defaults, with the same messages (they name
 * "rope_scaling.<key>"). Python's LLMConfig(rope_scaling=...) is read here.
 * The values are checked with the rest of a config by sneppx_config_validate.
 * scaling is written only on success. Thread-safe. */
SNEPPX_API sneppx_status sneppx_rope_scaling_from_json(const char *json_text, size_t length,
                                                      sneppx_rope_scaling *scaling);

/* Number of presets and the CLI name of the i-th ("llama2-7B"). */
SNEPPX_API int sneppx_preset_count(void);
SNEPPX_API const char *sneppx_preset_name(int index);

/* A sneppx_dtype's name ("float32", "bfloat16", "float16", "int8"), or NULL for a value
 * that is not one. */
SNEPPX_API const char *sneppx_dtype_name(int dtype);

/* Checks every field; the error message names the first bad one. */
SNEPPX_API sneppx_status sneppx_config_validate(const sneppx_config *config);

/* Static NTK-aware context extension: rope_theta' = rope_theta * (n/orig)^(d/(d-2))
 * with d the rotary dim and orig the current max_position_embeddings, which
 * becomes n. Composes with every RoPE type (they all build on rope_theta);
 * n must exceed orig and be at most 2^40 (the largest max_position_embeddings
 * sneppx_config_validate accepts). */
SNEPPX_API sneppx_status sneppx_config_extend_context(sneppx_config *config, int64_t new_max_positions);

/* Writes RoPE inverse frequencies (rotary_dim/2 values) and the cos/sin
 * attention factor the config implies, in double precision. For the dynamic
 * type, max_position is max(position_ids)+1 of the call (else ignored). */
SNEPPX_API sneppx_status sneppx_config_rope_frequencies(const sneppx_config *config, int64_t max_position,
                                                        double *inv_freq, int64_t inv_freq_len,
                                                        double *attention_factor);

/* Softmax scale the config implies (head_dim^-0.5; DeepSeek: (nope+rope)^-0.5 * mscale^2). */
SNEPPX_API double sneppx_config_softmax_scale(const sneppx_config *config);

#ifdef __cplusplus
}
#endif
#endif
