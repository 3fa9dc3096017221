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
be imported. With --serve (no --contexts) it prints `ready` after the version
and answers the requests of decode_serve.py instead: each step at the context
asked for, its token cropped off the cache after it (DynamicCache.crop(-1)).
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
    parser.add_argument("--contexts", help="comma-separated context lengths (unless --serve)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--serve", action="store_true", help="answer decode_serve.py's requests on stdin")
    args = parser.parse_args()
    if not args.serve and not args.contexts:
        parser.error("--contexts is required without --serve")
    return args


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


class Decoder:
    """The layer and a DynamicCache of `batch` rows at a context (prepare), and
    its decode steps over it (step)."""

    def __init__(self, torch, transformers, args):
        from transformers.cache_utils import DynamicCache
        self.torch, self.DynamicCache, self.args = torch, DynamicCache, args
        self.config, attention, self.rotary = make_layer(torch, transformers, args)
        self.dtype = getattr(torch, args.dtype)
        self.attention = attention.to(self.dtype)
        self.generator = torch.Generator().manual_seed(1)
        # transformers renamed the argument (past_key_values -> cache) in 5.x.
        self.cache_argument = ("cache" if "cache" in inspect.signature(self.attention.forward).parameters
                               else "past_key_values")

    def random(self, *shape):
        return (self.torch.rand(*shape, generator=self.generator) * 2 - 1).to(self.dtype)

    def prepare(self, context, batch):
        """A cache of `batch` rows of `context` random K/V entries, and a warm-up step."""
        args = self.args
        self.cache = self.DynamicCache()
        shape = (batch, args.kv_heads, context, args.head_dim)
        self.cache.update(self.random(*shape), self.random(*shape), 0)
        self.batch, self.length = batch, context
        self.step(keep=False)

    def step(self, keep=False):
        """One token per row through the layer at the cache's length; the seconds of the
        layer's call. keep: the cache keeps the token (else it is cropped off again)."""
        torch = self.torch
        x = self.random(self.batch, 1, self.args.hidden)
        positions = torch.full((self.batch, 1), self.length, dtype=torch.long)
        cos, sin = self.rotary(x, positions)
        start = time.perf_counter()
        self.attention(hidden_states=x, position_embeddings=(cos, sin), attention_mask=None,
                       cache_position=torch.tensor([self.length]), **{self.cache_argument: self.cache})
        seconds = time.perf_counter() - start
        if keep:
            self.length += 1
        else:
            self.cache.crop(-1)  # the step's token off again (a negative count: every version takes it)
        return seconds


def main():
    args = parse_args()
    try:
        import torch
        import transformers
    except ImportError as error:
        print(f"unavailable {error}")
        return 0
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__} transformers {transformers.__version__}", flush=True)
    decoder = Decoder(torch, transformers, args)
    with torch.inference_mode():  # as generate() runs the model: its cache, its steps
        if args.serve:
            from decode_serve import serve
            print("ready", flush=True)
            serve(decoder, sys.stdin, sys.stdout)
            return 0
        for context in (int(c) for c in args.contexts.split(",")):
            decoder.prepare(context, args.batch)  # its step is the warm-up
            times = [decoder.step(keep=True) for _ in range(args.steps)]
            print(f"result {context} {args.batch} {args.threads} {statistics.median(times):.6f} "
                  f"{min(times):.6f} {max(times):.6f} {len(times)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
