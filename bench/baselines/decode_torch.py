#!/usr/bin/env python3
"""PyTorch baseline for the decode steps of sneppx-bench (the generate and
precision stages): HF transformers' LlamaAttention (attn_implementation "sdpa",
so torch's scaled_dot_product_attention) with a DynamicCache, as
`model.generate()` runs each layer, from the virtual environment scripts/venv.sh
makes; a server of decode_serve.py's requests, so that the bench times its steps
in the same rounds as its own.

A cache of B rows at context C is filled with C random K/V entries per row
through DynamicCache.update (a prefill would compute the same cache; its cost is
not what is measured); a step runs the layer on one new token per row (hidden
[B, 1, hidden]) and crops it off the cache again (DynamicCache.crop(-1)), so
every step sees context C. Every row has the same context (HF pads ragged rows
to one length). --dtype bfloat16 / float16 runs the layer's weights,
activations and cache in that type (as `torch_dtype=` loads a model). Prints at
start, for the bench:
    torch <version> transformers <version>
    ready
or `unavailable <reason>` (and exit status 0) when torch or transformers cannot
be imported.
"""
import argparse
import inspect
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True)
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--rope-theta", type=float, required=True)
    parser.add_argument("--threads", type=int, required=True)
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
        self.step()

    def step(self):
        """One token per row through the layer at the cache's length, cropped off again;
        the seconds of the layer's call."""
        torch = self.torch
        x = self.random(self.batch, 1, self.args.hidden)
        positions = torch.full((self.batch, 1), self.length, dtype=torch.long)
        cos, sin = self.rotary(x, positions)
        start = time.perf_counter()
        self.attention(hidden_states=x, position_embeddings=(cos, sin), attention_mask=None,
                       cache_position=torch.tensor([self.length]), **{self.cache_argument: self.cache})
        seconds = time.perf_counter() - start
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
    from decode_serve import serve
    print("ready", flush=True)
    with torch.inference_mode():  # as generate() runs the model: its cache, its steps
        serve(decoder, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
