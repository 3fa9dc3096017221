#!/usr/bin/env python3
"""llama.cpp baseline for the decode stage of sneppx-bench: one transformer block
with an attention layer of the given shape, run by llama.cpp (through
llama-cpp-python, from the virtual environment scripts/venv.sh makes).

The model is a GGUF this script writes with the `gguf` package: one block whose
attention has the requested shape, random float32 weights (or float16 / bfloat16 / q8_0
with --weight-type f16 / bf16 / q8_0), a feed-forward of FFN_WIDTH columns and a vocabulary of
VOCAB tokens, so that everything that is not attention reads
`non_attention_bytes()` per step (printed, so the bench can say what it costs;
about 3% of llama3-8B's attention weights). Flash attention is on and the KV
cache is float32 (or --kv-type f16 / bf16 / q8_0).

A server of decode_serve.py's requests, so that the bench times its steps in
the same rounds as its own: a cache of B sequences at context C is B prefills
of C tokens (batches of up to 512 tokens); a step appends one token to every
sequence (one llama_decode of B tokens) and removes them again
(llama_memory_seq_rm), so every step sees context C. Prints at start, for the
bench:
    llama.cpp <version>
    nonattention_bytes <bytes>
    ready
or `unavailable <reason>` (and exit status 0) when llama_cpp cannot be imported.
"""
import argparse
import os
import sys
import tempfile
import time

VOCAB = 256
# ggml's type numbers (ggml.h enum ggml_type) and the GGUF file types (llama.h
# LLAMA_FTYPE_MOSTLY_*) of the element types this script writes.
GGML_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}
WEIGHT_FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}
WEIGHT_BYTES = {"f32": 4, "f16": 2, "q8_0": 34 / 32, "bf16": 2}
# Types gguf writes as raw bytes from its own quantizer (numpy has no bfloat16).
QUANTIZED = {"q8_0": "Q8_0", "bf16": "BF16"}
_quiet_log = None
FFN_WIDTH = 32


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True)
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--rope-theta", type=float, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--weight-type", choices=tuple(WEIGHT_FILE_TYPES), default="f32")
    parser.add_argument("--kv-type", choices=tuple(GGML_TYPES), default="f32")
    return parser.parse_args()


def non_attention_bytes(args, element_bytes):
    """Weights a decode step reads besides attention: FFN, norms, output layer, one embedding row."""
    ffn = 3 * args.hidden * FFN_WIDTH
    return (ffn + VOCAB * args.hidden + 3 * args.hidden + args.hidden) * element_bytes


def write_model(gguf, np, args, path):
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("sneppx-attention-bench")
    writer.add_block_count(1)
    writer.add_context_length(1 << 20)
    writer.add_embedding_length(args.hidden)
    writer.add_feed_forward_length(FFN_WIDTH)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.kv_heads)
    writer.add_key_length(args.head_dim)
    writer.add_value_length(args.head_dim)
    writer.add_rope_dimension_count(args.head_dim)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(WEIGHT_FILE_TYPES[args.weight_type])
    writer.add_tokenizer_model("llama")
    writer.add_token_list([b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(VOCAB - 3)])
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types([2, 3, 3] + [6] * (VOCAB - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    rng = np.random.default_rng(0)
    def weight(rows, cols):
        values = (rng.random((rows, cols), dtype=np.float32) * 2 - 1) * cols ** -0.5
        if args.weight_type in QUANTIZED:  # q8_0: blocks of 32, an f16 scale and 32 int8
            return gguf.quants.quantize(values, gguf.GGMLQuantizationType[QUANTIZED[args.weight_type]])
        return values.astype(np.float16 if args.weight_type == "f16" else np.float32)

    def add_weight(name, rows, cols):
        data = weight(rows, cols)
        if args.weight_type in QUANTIZED:
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[QUANTIZED[args.weight_type]])
        else:
            writer.add_tensor(name, data)

    ones = np.ones(args.hidden, dtype=np.float32)  # norms stay float32, as llama.cpp's converter keeps them
    q_dim, kv_dim = args.heads * args.head_dim, args.kv_heads * args.head_dim
    add_weight("token_embd.weight", VOCAB, args.hidden)
    writer.add_tensor("blk.0.attn_norm.weight", ones)
    add_weight("blk.0.attn_q.weight", q_dim, args.hidden)
    add_weight("blk.0.attn_k.weight", kv_dim, args.hidden)
    add_weight("blk.0.attn_v.weight", kv_dim, args.hidden)
    add_weight("blk.0.attn_output.weight", args.hidden, q_dim)
    writer.add_tensor("blk.0.ffn_norm.weight", ones)
    add_weight("blk.0.ffn_gate.weight", FFN_WIDTH, args.hidden)
    add_weight("blk.0.ffn_up.weight", FFN_WIDTH, args.hidden)
    add_weight("blk.0.ffn_down.weight", args.hidden, FFN_WIDTH)
    writer.add_tensor("output_norm.weight", ones)
    add_weight("output.weight", VOCAB, args.hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class Runner:
    """One llama.cpp context over the model, with `sequences` sequences of up to
    context + 1 tokens."""

    def __init__(self, llama, path, args, context, sequences):
        self.llama = llama
        params = llama.llama_model_default_params()
        self.model = llama.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError("llama.cpp could not load the model")
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = sequences * (context + 1)
        cparams.n_batch = 512
        cparams.n_ubatch = 512
        cparams.n_seq_max = sequences
        cparams.n_threads = args.threads
        cparams.n_threads_batch = args.threads
        kv_type = GGML_TYPES[args.kv_type]
        cparams.type_k = kv_type
        cparams.type_v = kv_type
        if hasattr(cparams, "flash_attn_type"):
            cparams.flash_attn_type = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
        else:
            cparams.flash_attn = True
        self.ctx = llama.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.batch = llama.llama_batch_init(512, 0, sequences)
        self.sequences = sequences

    def decode(self, entries):
        """entries: (token, position, sequence) tuples, at most 512."""
        batch = self.batch
        batch.n_tokens = len(entries)
        for i, (token, position, sequence) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = 0
        batch.logits[len(entries) - 1] = 1
        status = self.llama.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def prefill(self, context):
        for sequence in range(self.sequences):
            for begin in range(0, context, 512):
                end = min(context, begin + 512)
                self.decode([(3 + (p % (VOCAB - 3)), p, sequence) for p in range(begin, end)])

    def step(self, position):
        self.decode([(3 + ((position + s) % (VOCAB - 3)), position, s) for s in range(self.sequences)])

    def forget(self, position):
        """Every sequence's tokens from `position` on out of the cache (llama.cpp's
        memory API; llama_kv_self_seq_rm before it, llama_kv_cache_seq_rm before that)."""
        llama = self.llama
        if hasattr(llama, "llama_memory_seq_rm"):
            removed = llama.llama_memory_seq_rm(llama.llama_get_memory(self.ctx), -1, position, -1)
        elif hasattr(llama, "llama_kv_self_seq_rm"):
            removed = llama.llama_kv_self_seq_rm(self.ctx, -1, position, -1)
        else:
            removed = llama.llama_kv_cache_seq_rm(self.ctx, -1, position, -1)
        if not removed:
            raise RuntimeError(f"llama.cpp kept the tokens from position {position} on")

    def close(self):
        self.llama.llama_batch_free(self.batch)
        self.llama.llama_free(self.ctx)
        self.llama.llama_model_free(self.model)


class Session:
    """decode_serve.py's session: a Runner at one context at a time, whose steps
    each run at that context (their tokens forgotten after them)."""

    def __init__(self, llama, path, args):
        self.llama, self.path, self.args, self.runner = llama, path, args, None

    def prepare(self, context, batch):
        self.close()
        self.runner = Runner(self.llama, self.path, self.args, context, batch)
        self.runner.prefill(context)
        self.context = context
        self.step()  # warm-up: first touch of the step's buffers

    def step(self):
        start = time.perf_counter()
        self.runner.step(self.context)
        seconds = time.perf_counter() - start
        self.runner.forget(self.context)
        return seconds

    def close(self):
        if self.runner:
            self.runner.close()
            self.runner = None


def main():
    args = parse_args()
    try:
        import numpy as np
        import gguf
        import llama_cpp
    except ImportError as error:
        print(f"unavailable {error}")
        return 0
    print(f"llama.cpp llama-cpp-python {llama_cpp.__version__}", flush=True)
    print(f"nonattention_bytes {int(non_attention_bytes(args, WEIGHT_BYTES[args.weight_type]))}", flush=True)
    llama_cpp.llama_backend_init()
    global _quiet_log  # ctypes calls it for as long as llama.cpp runs: keep it alive
    _quiet_log = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(_quiet_log, None)
    with tempfile.TemporaryDirectory(prefix="sneppx-llama-") as directory:
        path = os.path.join(directory, "attention.gguf")
        write_model(gguf, np, args, path)
        from decode_serve import serve
        session = Session(llama_cpp, path, args)
        print("ready", flush=True)
        serve(session, sys.stdin, sys.stdout)
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
