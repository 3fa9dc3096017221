/* Internal: what a layer holds. One layer = one config, its resolved kernels,
 * its packed weights and a pool of per-call workspaces. The files that work
 * on it declare their calls in headers of their own stem: weights.h,
 * rope_tables.h, forward.h, workspace.h, threads.h. */
#ifndef SNEPPX_RUNTIME_LAYER_INTERNAL_H
#define SNEPPX_RUNTIME_LAYER_INTERNAL_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kernels.h"
#include "sneppx/cache.h"
#include "sneppx/layer.h"

/* A packed GEMM operand: weights in the kernel's panel layout (+ bias). */
struct sneppx_packed_gemm {
    const sneppx_kernel *kernel;   /* gemm-k<K>-n<N>-bias<0|1>-<weight type>-v<vw> */
    int64_t k, n;
    sneppx_dtype weight_type;      /* the panels' (config.weight_dtype) */
    int bf16_pairs;                /* config.compute_dtype bfloat16: a gemm_bf16dot-k<K>-n<N>-bias<0|1>-v<vw>
                                      kernel, panels of bfloat16 pairs along k */
    void *panels;                  /* sneppx_gemm_packed_bytes(k, n, gemm_nr, weight_type) per instance,
                                      or with bf16_pairs sneppx_gemm_packed_pair_bytes(k, n, gemm_nr) */
    int64_t panel_bytes;           /* bytes of one instance (MLA packs one per head) */
    int64_t instances;             /* packed matrices: 1, or heads for MLA's absorption */
    float *bias;                   /* [n] or NULL */
    int threads;                   /* the layer's, for packing */
};

/* Scratch of one forward call, reused across calls (never allocated per call
 * once the pool holds one large enough). */
struct sneppx_workspace {
    struct sneppx_workspace *next;
    int64_t tokens, seq_len, threads;
    size_t floats;     /* of buffer: the pool lends the smallest that fits */
    float *buffer;
    float *qkv;        /* [tokens, qkv_dim]: fused projections (MLA: q) */
    float *latent;     /* MLA: [tokens, kv_lora + rope] (c | k_pe) */
    float *q_absorbed; /* MLA absorbed: [tokens, H, kv_lora + rope]; naive: k [tokens, H*dq] */
    float *q_lora;     /* MLA with q LoRA: [tokens, q_lora_rank] */
    float *kv_expanded;/* MLA naive: [tokens, H*(nope+v)] */
    float *attn_out;   /* [tokens, H*dv] (MLA absorbed: [tokens, H*kv_lora]) */
    float *heads_out;  /* MLA absorbed: [tokens, H*v_head_dim] after W_UV */
    float *cos, *sin;  /* [tokens, rotary_dim/2] */
    float *thread_scratch; /* threads x thread_scratch_floats */
    int64_t thread_scratch_floats;
    /* Cached forward (workspace.h's sneppx_workspace_needs): */
    int64_t gather_floats, plan_bytes;
    int64_t thread_gather_offset; /* floats from a thread's scratch to its gather buffer */
    void *plan;
};

/* The attention kernels of a layer, by family: index 0/1 is the use_flash_attn
 * switch; decode (paged K/V read in place) serves the cached forward's short
 * query runs. */
enum sneppx_attention_kind { SNEPPX_ATTN_SDPA = 0, SNEPPX_ATTN_FLASH = 1, SNEPPX_ATTN_DECODE = 2, SNEPPX_ATTN_KINDS = 3 };

/* Kernels one layer can resolve: MLA absorbed with q LoRA has 9, plus 4 flash / SDPA
 * variants and 2 decode ones per KV cache type. */
#define SNEPPX_LAYER_MAX_KERNELS (13 + 2 * SNEPPX_DTYPE_COUNT)

struct sneppx_layer {
    sneppx_config config;
    const struct sneppx_target *target; /* of the host, picked at create */
    int is_mla;
    int64_t head_dim;        /* q/k dim of one head (MLA: nope + rope) */
    int64_t v_head_dim;
    int64_t rotary_dim;
    int64_t group;           /* query heads per K/V head */
    int64_t kv_heads;
    int64_t q_dim, kv_dim, qkv_dim, attn_dim;
    float softmax_scale;

    struct sneppx_packed_gemm qkv_proj;   /* non-MLA: fused q|k|v; MLA: q_proj or q_b_proj */
    struct sneppx_packed_gemm o_proj;
    /* MLA */
    struct sneppx_packed_gemm q_a_proj, kv_a_proj, kv_b_proj, absorb_uk, absorb_uv;
    float *q_a_norm_weight, *kv_a_norm_weight;
    const sneppx_kernel *q_a_norm, *kv_a_norm;
    int64_t latent_dim;      /* kv_lora_rank + qk_rope_head_dim */

    const sneppx_kernel *rope;
    /* attention kernels, resolved on first use: [enum sneppx_attention_kind][implicit|explicit mask] */
    _Atomic(const sneppx_kernel *) attention[SNEPPX_ATTN_KINDS][2];
    /* decode's, by the KV cache's element type: [sneppx_dtype][implicit|explicit mask];
     * attention[SNEPPX_ATTN_DECODE] stays unused */
    _Atomic(const sneppx_kernel *) decode[SNEPPX_DTYPE_COUNT][2];
    int64_t attn_head_dim, attn_v_head_dim, attn_group, attn_window; /* attention key values */
    atomic_int use_flash;

    double *inv_freq;        /* [rotary_dim/2], for non-dynamic positions */
    double attention_factor;
    pthread_mutex_t lock;    /* guards the cos/sin cache, the workspace pool and its counts, writes of
                                config.use_flash_attn */
    float *cos_cache, *sin_cache;
    int64_t cached_positions;
    struct sneppx_workspace *free_workspaces;
    int workspaces_lent, workspaces_lent_peak; /* held by calls now; at most at once (workspace.c) */

    /* A shard of a bigger layer (runtime/shard.h): its place and transport; NULL otherwise. */
    struct sneppx_layer_shard *shard;

    /* The resolved kernels, added under lock. A forward that resolves an attention
     * variant adds one while other threads read them (_kernel_count, _kernel_timing and
     * _keys are safe beside forwards), so a slot is written before the release store of
     * timing_count that counts it, and never after. */
    sneppx_kernel_timing timings[SNEPPX_LAYER_MAX_KERNELS]; /* one per distinct resolved kernel */
    atomic_int timing_count;
    char keys[SNEPPX_LAYER_MAX_KERNELS * (SNEPPX_KEY_MAX + 1) + 1]; /* one per line, under lock */
    size_t keys_len;
    /* What sneppx_layer_keys() returns: a copy of keys made by each resolve that added
     * lines, never written after its release store (a caller may read the string it got
     * while a forward adds a line), and never freed before the layer. */
    _Atomic(const char *) keys_published;
    struct sneppx_keys_copy *keys_copies;
};

/* layer.c, for tests */
/* A layer with its kernels resolved and no weights packed (every panel NULL):
 * for tests that put their own kernels in its place and follow the forward's
 * stages and tasks (tests/test_vendored_agreement.c) at a preset's size
 * without its weights. Its forward must not run the real kernels. */
sneppx_status sneppx_layer_create_unpacked(const sneppx_config *config, sneppx_layer **layer);
/* The layer's attention kernel of a kind (enum sneppx_attention_kind; the
 * use_flash_attn switch's value is its kind) and mask mode, resolved on first
 * use (a layer made with flash resolves SDPA when switched, the explicit-mask
 * variant at its first masked call, decode at its first cached decode). Thread-safe. */
sneppx_status sneppx_layer_attention_kernel(sneppx_layer *layer, int kind, int explicit_mask,
                                            const sneppx_kernel **kernel);
/* The decode kernel over a KV cache of element type kv_type, as above. */
sneppx_status sneppx_layer_decode_kernel(sneppx_layer *layer, sneppx_dtype kv_type, int explicit_mask,
                                         const sneppx_kernel **kernel);

#endif
