#!/usr/bin/env python3
"""PyTorch baseline for the decode stage of sneppx-bench: HF transformers'
LlamaAttention (attn_implementation "sdpa", so torch's
scaled_dot_product_attention) with a DynamicCache, as `model.generate()` runs
each layer, from the virtual environment scripts/venv.sh makes.

For each context C the cache of each of B rows is filled with C random K/V
entries through DynamicCache.update (a prefill would compute the same cache;
its cost is not what is measured), then STEPS decode steps each run the layer
on one new token per row (hidden [B, 1, hidden]), timed one by one; the
cos/sin of the new positions are computed outside the timed call, as the model
does once for all its layers. Every row has the same context (HF pads ragged
rows to one length). --dtype bfloat16 / float16 runs the layer's weights,
activations and cache in that type (as `torch_dtype=` loads a model). Prints, for the bench:
    torch <version> transformers <version>
    result <context> <batch> <threads> <median s> <min s> <max s> <steps>
or `unavailable <reason>` (and exit status 0) when torch or transformers cannot
be imported.
"""
import argparse
import inspect
import statistics
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True)
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--rope-theta", type=float, required=True)
    parser.add_argument("--contexts", required=True, help="comma-separated context lengths")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    return parser.parse_args()


def make_layer(torch, transformers, args):
    from transformers.models.llama import modeling_llama
    config = transformers.LlamaConfig(
        hidden_size=args.hidden, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, rope_theta=args.rope_theta, max_position_embeddings=1 << 20,
        attention_bias=False, intermediate_size=32, vocab_size=256, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    attention = modeling_llama.LlamaAttention(config, layer_idx=0).eval()
    rotary = modeling_llama.LlamaRotaryEmbedding(config=config)
    return config, attention, rotary


def main():
    args = parse_args()
    try:
        import torch
        import transformers
        from transformers.cache_utils import DynamicCache
    except ImportError as error:
        print(f"unavailable {error}")
        return 0
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__} transformers {transformers.__version__}", flush=True)
    config, attention, rotary = make_layer(torch, transformers, args)
    dtype = getattr(torch, args.dtype)
    attention = attention.to(dtype)
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for context in (int(c) for c in args.contexts.split(",")):
            cache = DynamicCache()
            # transformers renamed the argument (past_key_values -> cache) in 5.x.
            cache_argument = "cache" if "cache" in inspect.signature(attention.forward).parameters else "past_key_values"
            shape = (args.batch, args.kv_heads, context, args.head_dim)
            cache.update((torch.rand(shape, generator=generator) * 2 - 1).to(dtype),
                         (torch.rand(shape, generator=generator) * 2 - 1).to(dtype), 0)
            times = []
            for step in range(args.steps + 1):  # the first step is a warm-up
                position = context + step
                x = (torch.rand(args.batch, 1, args.hidden, generator=generator) * 2 - 1).to(dtype)
                positions = torch.full((args.batch, 1), position, dtype=torch.long)
                cos, sin = rotary(x, positions)
                start = time.perf_counter()
                attention(hidden_states=x, position_embeddings=(cos, sin), attention_mask=None,
                          cache_position=torch.tensor([position]), **{cache_argument: cache})
                if step:
                    times.append(time.perf_counter() - start)
            print(f"result {context} {args.batch} {args.threads} {statistics.median(times):.6f} "
                  f"{min(times):.6f} {max(times):.6f} {len(times)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
