/* The forward pipeline: projections -> RoPE -> attention -> O projection, each
 * stage a parallel loop (OpenMP) over the tiles of single-threaded JIT kernels.
 * Every vendored layer runs the same stages over the same tasks
 * (templates/layer*.c.j2; tests/test_vendored_agreement.c compares the two). */
#include <omp.h>
#include <string.h>

#include "forward.h"
#include "kernel_args.h"
#include "shard.h"
#include "threads.h"
#include "sneppx_abi.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* dst[r, i*dst_step + c] = src[r, i*src_step + :] @ W_i (+ bias) for `instances`
 * packed matrices (MLA's per-head absorption; 1 for an ordinary projection). */
static void run_gemm(const sneppx_layer *layer, const struct sneppx_packed_gemm *gemm, int64_t instances,
                     const float *src, int64_t src_stride, int64_t src_step, float *dst, int64_t dst_stride,
                     int64_t dst_step, int64_t rows)
{
    const int threads = sneppx_thread_count(layer);
    const struct sneppx_gemm_tiles tile =
        sneppx_gemm_tiles_for(rows, gemm->n, layer->target->gemm_mr, instances, threads);
    const int64_t row_tiles = ceil_div(rows, tile.rows);
    const int64_t col_tiles = ceil_div(gemm->n, tile.cols);
    const int64_t tasks = instances * row_tiles * col_tiles;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t instance = task / (row_tiles * col_tiles);
        const int64_t col_tile = task / row_tiles % col_tiles;
        const int64_t row_tile = task % row_tiles;
        struct sneppx_args args = sneppx_kernel_args();
        args.row_begin = row_tile * tile.rows;
        args.row_end = args.row_begin + tile.rows < rows ? args.row_begin + tile.rows : rows;
        args.col_begin = col_tile * tile.cols;
        args.col_end = args.col_begin + tile.cols < gemm->n ? args.col_begin + tile.cols : gemm->n;
        args.src = src + instance * src_step;
        args.src_stride = src_stride;
        args.weight = (const char *)gemm->panels + instance * gemm->panel_bytes;
        args.bias = gemm->bias;
        args.dst = dst + instance * dst_step;
        args.dst_stride = dst_stride;
        gemm->kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
}

/* A shard's O projection is summed over the ranks in chunks of at least this many
 * rows, at most SUM_CHUNKS of them: each chunk's sum starts as soon as its rows are
 * written and runs (as far as the transport progresses on its own) while the GEMM
 * writes the next rows. */
#define SUM_CHUNKS 4
#define SUM_CHUNK_MIN_ROWS 64

/* out[r, :] = src[r, :] @ W_o (+ bias) for the call's tokens; a shard then sums
 * out over the ranks in place. Fails only for a shard whose transport fails. */
static sneppx_status run_output_projection(const sneppx_layer *layer, const float *src, int64_t src_stride,
                                           float *out, int64_t tokens)
{
    const int64_t hidden = layer->config.hidden_size;
    if (!layer->shard) {
        run_gemm(layer, &layer->o_proj, 1, src, src_stride, 0, out, hidden, 0, tokens);
        return SNEPPX_OK;
    }
    int64_t chunks = tokens / SUM_CHUNK_MIN_ROWS;
    chunks = chunks < 1 ? 1 : chunks > SUM_CHUNKS ? SUM_CHUNKS : chunks;
    /* Whole GEMM register tiles per chunk but the last, on every target: a transport pairs
     * each rank's n-th sum with the others' n-th, and MPI needs their counts equal, while
     * ranks on AVX-512 and AVX2 hosts cut 14- and 6-row tiles. */
    const int64_t chunk_rows = ceil_div(ceil_div(tokens, chunks), SNEPPX_GEMM_ROW_ALIGN) * SNEPPX_GEMM_ROW_ALIGN;
    sneppx_status status = SNEPPX_OK;
    for (int64_t row = 0; row < tokens && status == SNEPPX_OK; row += chunk_rows) {
        const int64_t rows = tokens - row < chunk_rows ? tokens - row : chunk_rows;
        run_gemm(layer, &layer->o_proj, 1, src + row * src_stride, src_stride, 0, out + row * hidden, hidden, 0,
                 rows);
        status = sneppx_shard_sum_start(layer->shard, out + row * hidden, rows * hidden);
    }
    /* Wait even after a failure: no sum may still write into out once the call returns. */
    const sneppx_status waited = sneppx_shard_sum_wait(layer->shard);
    return status != SNEPPX_OK ? status : waited;
}

/* RoPE in place on `heads` heads of every token row of data. */
static void run_rope(const sneppx_layer *layer, const struct sneppx_workspace *ws, float *data, int64_t stride,
                     int64_t heads, int64_t head_stride, int64_t rows)
{
    const int64_t tasks = ceil_div(rows, SNEPPX_ROW_TASK_ROWS);
#pragma omp parallel for schedule(static) num_threads(sneppx_thread_count(layer))
    for (int64_t task = 0; task < tasks; task++) {
        struct sneppx_args args = sneppx_kernel_args();
        args.row_begin = task * SNEPPX_ROW_TASK_ROWS;
        args.row_end = args.row_begin + SNEPPX_ROW_TASK_ROWS < rows ? args.row_begin + SNEPPX_ROW_TASK_ROWS : rows;
        args.dst = data;
        args.dst_stride = stride;
        args.rope_heads = heads;
        args.rope_head_stride = head_stride;
        args.cos = ws->cos;
        args.sin = ws->sin;
        layer->rope->entry[SNEPPX_ENTRY_RUN](&args);
    }
}

static void run_rmsnorm(const sneppx_layer *layer, const sneppx_kernel *kernel, const float *weight, float *data,
                        int64_t stride, int64_t rows)
{
    const int64_t tasks = ceil_div(rows, SNEPPX_ROW_TASK_ROWS);
#pragma omp parallel for schedule(static) num_threads(sneppx_thread_count(layer))
    for (int64_t task = 0; task < tasks; task++) {
        struct sneppx_args args = sneppx_kernel_args();
        args.row_begin = task * SNEPPX_ROW_TASK_ROWS;
        args.row_end = args.row_begin + SNEPPX_ROW_TASK_ROWS < rows ? args.row_begin + SNEPPX_ROW_TASK_ROWS : rows;
        args.src = data;
        args.src_stride = stride;
        args.dst = data;
        args.dst_stride = stride;
        args.weight = weight;
        args.eps = 1e-6f; /* DeepSeek's q_a/kv_a layernorms use the class default, not rms_norm_eps */
        kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
}

/* Where one (sequence, kv head) finds its operands. */
struct attention_operands {
    const float *q, *k, *v;
    float *o;
    int64_t q_stride, k_stride, v_stride, o_stride;
    int64_t q_head_step, k_head_step, v_head_step, o_head_step; /* per kv head */
    int64_t q_batch_step, k_batch_step, v_batch_step, o_batch_step;
};

static void run_attention(const sneppx_layer *layer, const struct sneppx_workspace *ws,
                          const sneppx_kernel *kernel, const struct attention_operands *ops, int64_t batch,
                          int64_t seq_len, const float *mask, int64_t mask_batch_stride)
{
    const int threads = sneppx_thread_count(layer);
    const int64_t tile_rows = sneppx_attention_tile_rows(seq_len, batch, layer->kv_heads, threads);
    const int64_t q_tiles = ceil_div(seq_len, tile_rows);
    const int64_t tasks = batch * layer->kv_heads * q_tiles;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t task = 0; task < tasks; task++) {
        const struct sneppx_attention_task at =
            sneppx_attention_task_at(task, layer->kv_heads, q_tiles, tile_rows, seq_len);
        const int64_t b = at.sequence, kv_head = at.kv_head;
        struct sneppx_args args = sneppx_kernel_args();
        args.row_begin = at.row_begin;
        args.row_end = at.row_end;
        args.q = ops->q + b * ops->q_batch_step + kv_head * ops->q_head_step;
        args.k = ops->k + b * ops->k_batch_step + kv_head * ops->k_head_step;
        args.v = ops->v + b * ops->v_batch_step + kv_head * ops->v_head_step;
        args.o = ops->o + b * ops->o_batch_step + kv_head * ops->o_head_step;
        args.q_stride = ops->q_stride;
        args.k_stride = ops->k_stride;
        args.v_stride = ops->v_stride;
        args.o_stride = ops->o_stride;
        args.mask = mask ? mask + b * mask_batch_stride : NULL;
        args.mask_stride = seq_len;
        args.q_len = seq_len;
        args.kv_len = seq_len;
        args.softmax_scale = layer->softmax_scale;
        args.scratch = ws->thread_scratch + omp_get_thread_num() * ws->thread_scratch_floats;
        kernel->entry[SNEPPX_ENTRY_RUN](&args);
    }
}

static void project_standard(const sneppx_layer *layer, const struct sneppx_workspace *ws, int64_t tokens,
                             const float *hidden)
{
    const int64_t qkv_dim = layer->qkv_dim;
    run_gemm(layer, &layer->qkv_proj, 1, hidden, layer->config.hidden_size, 0, ws->qkv, qkv_dim, 0, tokens);
    /* q heads then k heads are contiguous in each qkv row: one pass rotates both. */
    run_rope(layer, ws, ws->qkv, qkv_dim, layer->config.num_attention_heads + layer->kv_heads, layer->head_dim,
             tokens);
}

static sneppx_status forward_standard(const sneppx_layer *layer, const struct sneppx_workspace *ws,
                             const sneppx_kernel *attention, int64_t batch, int64_t seq_len, const float *hidden,
                             const float *mask, int64_t mask_batch_stride, float *out)
{
    const int64_t tokens = batch * seq_len;
    const int64_t qkv_dim = layer->qkv_dim, head_dim = layer->head_dim;
    project_standard(layer, ws, tokens, hidden);
    const struct attention_operands ops = {
        .q = ws->qkv, .k = ws->qkv + layer->q_dim, .v = ws->qkv + layer->q_dim + layer->kv_dim, .o = ws->attn_out,
        .q_stride = qkv_dim, .k_stride = qkv_dim, .v_stride = qkv_dim, .o_stride = layer->attn_dim,
        .q_head_step = layer->group * head_dim, .k_head_step = head_dim, .v_head_step = head_dim,
        .o_head_step = layer->group * layer->v_head_dim,
        .q_batch_step = seq_len * qkv_dim, .k_batch_step = seq_len * qkv_dim, .v_batch_step = seq_len * qkv_dim,
        .o_batch_step = seq_len * layer->attn_dim};
    run_attention(layer, ws, attention, &ops, batch, seq_len, mask, mask_batch_stride);
    return run_output_projection(layer, ws->attn_out, layer->attn_dim, out, tokens);
}

/* Copies each head's rotated q_pe (or the shared k_pe) beside its latent/nope part. */
static void scatter_rope_part(const sneppx_layer *layer, int64_t tokens, const float *src, int64_t src_stride,
                              int64_t src_head_step, float *dst, int64_t dst_stride, int64_t dst_head_step)
{
    const int64_t heads = layer->config.num_attention_heads, rope = layer->config.qk_rope_head_dim;
#pragma omp parallel for schedule(static) num_threads(sneppx_thread_count(layer))
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++)
            memcpy(dst + t * dst_stride + h * dst_head_step, src + t * src_stride + h * src_head_step,
                   sizeof(float) * (size_t)rope);
}

/* q (with RoPE on q_pe) and the latent rows (kv_a_layernorm, RoPE on k_pe);
 * absorbed: q_absorbed = [q_nope W_UK | q_pe] per head. */
static void project_mla(const sneppx_layer *layer, const struct sneppx_workspace *ws, int64_t tokens,
                        const float *hidden)
{
    const sneppx_config *c = &layer->config;
    const int64_t hidden_size = c->hidden_size, heads = c->num_attention_heads;
    const int64_t nope = c->qk_nope_head_dim, rank = c->kv_lora_rank, latent = layer->latent_dim;
    const int64_t dq = layer->head_dim, q_dim = layer->q_dim;
    if (c->q_lora_rank > 0) {
        run_gemm(layer, &layer->q_a_proj, 1, hidden, hidden_size, 0, ws->q_lora, c->q_lora_rank, 0, tokens);
        run_rmsnorm(layer, layer->q_a_norm, layer->q_a_norm_weight, ws->q_lora, c->q_lora_rank, tokens);
        run_gemm(layer, &layer->qkv_proj, 1, ws->q_lora, c->q_lora_rank, 0, ws->qkv, q_dim, 0, tokens);
    } else {
        run_gemm(layer, &layer->qkv_proj, 1, hidden, hidden_size, 0, ws->qkv, q_dim, 0, tokens);
    }
    run_gemm(layer, &layer->kv_a_proj, 1, hidden, hidden_size, 0, ws->latent, latent, 0, tokens);
    run_rmsnorm(layer, layer->kv_a_norm, layer->kv_a_norm_weight, ws->latent, latent, tokens);
    run_rope(layer, ws, ws->qkv + nope, q_dim, heads, dq, tokens);
    run_rope(layer, ws, ws->latent + rank, latent, 1, latent, tokens);
    if (c->mla_naive)
        return;
    /* Absorbed: q_lat[h] = q_nope[h] W_UK[h] beside q_pe[h]. */
    const int64_t q_abs_stride = heads * latent;
    run_gemm(layer, &layer->absorb_uk, heads, ws->qkv, q_dim, dq, ws->q_absorbed, q_abs_stride, latent, tokens);
    scatter_rope_part(layer, tokens, ws->qkv + nope, q_dim, dq, ws->q_absorbed + rank, q_abs_stride, latent);
}

/* Absorbed MLA after attention: W_UV per head, then o_proj. */
static sneppx_status output_mla_absorbed(const sneppx_layer *layer, const struct sneppx_workspace *ws,
                                         int64_t tokens, float *out)
{
    const sneppx_config *c = &layer->config;
    const int64_t rank = c->kv_lora_rank;
    run_gemm(layer, &layer->absorb_uv, c->num_attention_heads, ws->attn_out, c->num_attention_heads * rank, rank,
             ws->heads_out, layer->attn_dim, c->v_head_dim, tokens);
    return run_output_projection(layer, ws->heads_out, layer->attn_dim, out, tokens);
}

static sneppx_status forward_mla(const sneppx_layer *layer, const struct sneppx_workspace *ws,
                        const sneppx_kernel *attention, int64_t batch, int64_t seq_len, const float *hidden,
                        const float *mask, int64_t mask_batch_stride, float *out)
{
    const sneppx_config *c = &layer->config;
    const int64_t tokens = batch * seq_len, heads = c->num_attention_heads;
    const int64_t nope = c->qk_nope_head_dim, rank = c->kv_lora_rank, latent = layer->latent_dim;
    const int64_t dq = layer->head_dim, q_dim = layer->q_dim, vdim = c->v_head_dim;
    project_mla(layer, ws, tokens, hidden);

    struct attention_operands ops;
    if (c->mla_naive) {
        /* K per head = [k_nope(h) | shared k_pe]; V read in place from kv_b's output. */
        const int64_t kv_width = heads * (nope + vdim);
        run_gemm(layer, &layer->kv_b_proj, 1, ws->latent, latent, 0, ws->kv_expanded, kv_width, 0, tokens);
        float *keys = ws->q_absorbed;
#pragma omp parallel for schedule(static) num_threads(sneppx_thread_count(layer))
        for (int64_t t = 0; t < tokens; t++)
            for (int64_t h = 0; h < heads; h++)
                memcpy(keys + t * q_dim + h * dq, ws->kv_expanded + t * kv_width + h * (nope + vdim),
                       sizeof(float) * (size_t)nope);
        scatter_rope_part(layer, tokens, ws->latent + rank, latent, 0, keys + nope, q_dim, dq);
        ops = (struct attention_operands){
            .q = ws->qkv, .k = keys, .v = ws->kv_expanded + nope, .o = ws->attn_out,
            .q_stride = q_dim, .k_stride = q_dim, .v_stride = kv_width, .o_stride = layer->attn_dim,
            .q_head_step = dq, .k_head_step = dq, .v_head_step = nope + vdim, .o_head_step = vdim,
            .q_batch_step = seq_len * q_dim, .k_batch_step = seq_len * q_dim, .v_batch_step = seq_len * kv_width,
            .o_batch_step = seq_len * layer->attn_dim};
        run_attention(layer, ws, attention, &ops, batch, seq_len, mask, mask_batch_stride);
        return run_output_projection(layer, ws->attn_out, layer->attn_dim, out, tokens);
    }
    /* Absorbed: attention over the shared latent (c | k_pe) as one kv head. */
    const int64_t q_abs_stride = heads * latent;
    ops = (struct attention_operands){
        .q = ws->q_absorbed, .k = ws->latent, .v = ws->latent, .o = ws->attn_out,
        .q_stride = q_abs_stride, .k_stride = latent, .v_stride = latent, .o_stride = heads * rank,
        .q_batch_step = seq_len * q_abs_stride, .k_batch_step = seq_len * latent, .v_batch_step = seq_len * latent,
        .o_batch_step = seq_len * heads * rank};
    run_attention(layer, ws, attention, &ops, batch, seq_len, mask, mask_batch_stride);
    return output_mla_absorbed(layer, ws, tokens, out);
}

sneppx_status sneppx_forward_run(const sneppx_layer *layer, const sneppx_kernel *attention,
                                 const struct sneppx_workspace *ws, int64_t batch, int64_t seq_len,
                                 const float *hidden, const float *mask, int64_t mask_batch_stride, float *out)
{
    if (layer->is_mla)
        return forward_mla(layer, ws, attention, batch, seq_len, hidden, mask, mask_batch_stride, out);
    return forward_standard(layer, ws, attention, batch, seq_len, hidden, mask, mask_batch_stride, out);
}

void sneppx_forward_project(const sneppx_layer *layer, const struct sneppx_workspace *ws, int64_t tokens,
                            const float *hidden)
{
    if (layer->is_mla)
        project_mla(layer, ws, tokens, hidden);
    else
        project_standard(layer, ws, tokens, hidden);
}

sneppx_status sneppx_forward_output(const sneppx_layer *layer, const struct sneppx_workspace *ws, int64_t tokens,
                                    float *out)
{
    if (layer->is_mla && !layer->config.mla_naive)
        return output_mla_absorbed(layer, ws, tokens, out);
    return run_output_projection(layer, ws->attn_out, layer->attn_dim, out, tokens);
}
