"""generate() tokens/s of a transformers model patched with sneppx.hf against the same
model unpatched (eager and sdpa attention).

The model is llama3-8B-shaped (hidden 4096, 32 heads, 8 KV heads, head_dim 128, MLP
14336, rope_theta 5e5) with few layers and a smaller vocabulary, randomly initialized,
float32: the attention share of a step is that of the real model, the embedding and
lm_head's less. Run with the venv of scripts/venv.sh, from the checkout after a build:

    PYTHONPATH=python SNEPPX_LIBRARY=build/runtime/libsneppx.so \\
        "$(scripts/venv.sh)"/bin/python bench/hf_generate.py [--layers 2] [--threads 2]

Prefill is generate(max_new_tokens=1); decode tokens/s is (new - 1) tokens over the rest
of generate(max_new_tokens=new); medians of --repeats runs after one warm-up. Greedy, so
every variant should give the same tokens: the table says whether they do.
"""
import argparse
import os
import statistics
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="generated tokens")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


ARGS = parse_args()
# Before torch loads: its GEMM library reads these once.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(ARGS.threads)

import torch  # noqa: E402
import transformers  # noqa: E402

import sneppx.hf  # noqa: E402


def build_model():
    config = transformers.LlamaConfig(
        vocab_size=ARGS.vocab, hidden_size=4096, intermediate_size=14336, num_hidden_layers=ARGS.layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, bos_token_id=None, eos_token_id=None,
        pad_token_id=0)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def timed_generate(model, ids, new):
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False)
    return time.perf_counter() - start, out


def measure(model, ids):
    timed_generate(model, ids, 4)    # warm-up: kernels, caches, allocator
    prefills, totals, tokens = [], [], None
    for _ in range(ARGS.repeats):
        prefills.append(timed_generate(model, ids, 1)[0])
        total, tokens = timed_generate(model, ids, ARGS.new)
        totals.append(total)
    prefill, total = statistics.median(prefills), statistics.median(totals)
    return {"prefill_ms": prefill * 1e3, "decode_tps": ARGS.batch * (ARGS.new - 1) / (total - prefill),
            "total_tps": ARGS.batch * ARGS.new / total, "tokens": tokens}


def main():
    torch.set_num_threads(ARGS.threads)
    model = build_model()
    ids = torch.randint(1, ARGS.vocab, (ARGS.batch, ARGS.prompt), generator=torch.Generator().manual_seed(1))
    results = {}
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        results[f"transformers {implementation}"] = measure(model, ids)
    model.set_attn_implementation("sdpa")    # the masks sneppx reads: None when there is no padding
    sneppx.hf.patch(model, num_threads=ARGS.threads)
    results["sneppx.hf.patch"] = measure(model, ids)

    print(f"llama3-8B-shaped, {ARGS.layers} layers, vocab {ARGS.vocab}, float32, batch {ARGS.batch}, prompt "
          f"{ARGS.prompt}, {ARGS.new} new tokens, {ARGS.threads} threads; torch {torch.__version__}, "
          f"transformers {transformers.__version__}; medians of {ARGS.repeats}")
    reference = results["transformers eager"]["tokens"]
    print(f"| {'attention':<20} | prefill ms | decode tokens/s | generate tokens/s | same tokens as eager |")
    print(f"|{'-' * 22}|------------|-----------------|-------------------|----------------------|")
    for name, result in results.items():
        same = "yes" if torch.equal(result["tokens"], reference) else "NO"
        print(f"| {name:<20} | {result['prefill_ms']:10.1f} | {result['decode_tps']:15.2f} | "
              f"{result['total_tps']:17.2f} | {same:<20} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
