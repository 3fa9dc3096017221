/* Internal: the HF config.json model types runtime/config_json.c reads, rendered
 * (model_types.c) from gen/sneppx_gen/model_types.py, the list gen's reader reads
 * too. A rule value added there needs its constant here and its code in both
 * readers. */
#ifndef SNEPPX_RUNTIME_MODEL_TYPES_H
#define SNEPPX_RUNTIME_MODEL_TYPES_H
#include <stdint.h>

/* How the type gives qkv_bias and o_bias. */
enum sneppx_model_bias {
    SNEPPX_MODEL_BIAS_ATTENTION_BIAS, /* "attention_bias" sets both (default false) */
    SNEPPX_MODEL_BIAS_NONE,           /* neither */
    SNEPPX_MODEL_BIAS_QKV             /* q/k/v on, o off (Qwen2Attention hard-codes them) */
};

/* How it gives a sliding window. */
enum sneppx_model_window {
    SNEPPX_MODEL_WINDOW_NONE,
    SNEPPX_MODEL_WINDOW_SLIDING_WINDOW,    /* "sliding_window": W keys (0 = none) */
    SNEPPX_MODEL_WINDOW_USE_SLIDING_WINDOW /* "use_sliding_window": true refused when a layer slides (Qwen2's rule) */
};

struct sneppx_model_type {
    const char *name;              /* config.json's model_type */
    int64_t default_max_positions; /* the transformers config class's default */
    enum sneppx_model_bias bias;
    enum sneppx_model_window window;
    int mla;                       /* DeepSeek's MLA fields (required) and interleaved RoPE pairs */
    /* The class's defaults when the file leaves the key out (a null is not that):
     * num_key_value_heads (0: num_attention_heads, as a null gives) and, for
     * SNEPPX_MODEL_WINDOW_SLIDING_WINDOW, sliding_window (a null: none). */
    int64_t default_kv_heads;
    int64_t default_window;
    int64_t default_q_lora_rank; /* MLA: when the file leaves it out (a null: 0, plain q_proj) */
};

extern const struct sneppx_model_type sneppx_model_types[];
extern const int sneppx_model_type_count;
/* "llama, mistral, ...": the supported list, for messages. */
extern const char sneppx_model_type_list[];

#endif
