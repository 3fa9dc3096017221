#!/usr/bin/python3
"""PyTorch baseline for sneppx-bench: one attention layer as HuggingFace
transformers runs it on a CPU: F.linear projections, rotate_half RoPE, then
attention as LlamaAttention's default attn_implementation "sdpa" computes it
(torch's scaled_dot_product_attention, is_causal and no mask plane, GQA without
repeat_kv where torch has enable_gqa), O projection. Without
scaled_dot_product_attention (torch < 2.0) or with --attention eager: HF's eager
path, repeat_kv, matmul + additive causal mask + float32 softmax + matmul.

The bench runs it as a subprocess per thread count, beside its own layer: the
bench asks for one forward at a time (`serve` below) and times each request,
so that PyTorch's forwards and sneppx's alternate in the same rounds and a slow
phase of this host's cores lands on both. The environment sets
OPENBLAS_NUM_THREADS/OMP_NUM_THREADS (Debian's PyTorch's GEMMs are OpenBLAS,
which torch.set_num_threads does not reach; the venv's are MKL's), the bench's own
OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE (unset, or OpenBLAS's Haswell core when sneppx runs
a narrower target than the host's), and GLIBC_TUNABLES keeping freed memory mapped (without it every
forward pays fresh page faults: 6.8 s instead of 0.99 s at T = 2048).

Prints at start, for the bench to parse:
    torch <version>
    attention <sdpa or eager> blas <BLAS_INFO of torch's build>
    ready
or `unavailable <reason>` (and exit status 0) when torch cannot be imported.
Like the model, it builds the causal mask and the cos/sin tables once per
forward of the whole model, outside the layer: they are not timed (each T's
are made at its first request, with its input).
"""
import argparse
import math
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True)
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--rope-theta", type=float, required=True)
    parser.add_argument("--qkv-bias", type=int, default=0)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa",
                        help="HF's attn_implementation (sdpa, its default, falls back to eager on torch < 2.0)")
    return parser.parse_args()


class Attention:
    """The weights and the forward of one layer: HF's SDPA attention (eager with --attention eager or on
    torch < 2.0)."""

    def __init__(self, torch, args):
        self.torch = torch
        self.hidden, self.heads, self.kv_heads, self.head_dim = args.hidden, args.heads, args.kv_heads, args.head_dim
        self.groups = args.heads // args.kv_heads
        generator = torch.Generator().manual_seed(0)

        def linear(out_features, in_features, bias):
            scale = in_features ** -0.5
            weight = (torch.rand(out_features, in_features, generator=generator) * 2 - 1) * scale
            return weight, (torch.rand(out_features, generator=generator) * 0.2 - 0.1) if bias else None

        self.q = linear(args.heads * args.head_dim, args.hidden, args.qkv_bias)
        self.k = linear(args.kv_heads * args.head_dim, args.hidden, args.qkv_bias)
        self.v = linear(args.kv_heads * args.head_dim, args.hidden, args.qkv_bias)
        self.o = linear(args.hidden, args.heads * args.head_dim, False)
        self.inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, args.head_dim, 2, dtype=torch.float32) / args.head_dim))
        F = torch.nn.functional
        self.sdpa = args.attention == "sdpa" and hasattr(F, "scaled_dot_product_attention")
        # HF passes enable_gqa (torch >= 2.5) when there is no mask plane, else repeats K/V.
        self.gqa = False
        if self.sdpa:
            try:
                F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8),
                                               torch.zeros(1, 1, 1, 8), enable_gqa=True)
                self.gqa = True
            except (TypeError, RuntimeError):
                pass

    def model_inputs(self, tokens):
        """What the model computes once for all its layers: cos/sin and the causal mask."""
        torch = self.torch
        positions = torch.arange(tokens, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        mask = torch.full((tokens, tokens), torch.finfo(torch.float32).min).triu(1)
        return emb.cos()[None, None], emb.sin()[None, None], mask[None, None]

    def rotate_half(self, x):
        half = x.shape[-1] // 2
        return self.torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def forward(self, x, cos, sin, mask):
        torch, F = self.torch, self.torch.nn.functional
        batch, tokens, _ = x.shape
        q = F.linear(x, *self.q).view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = F.linear(x, *self.k).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = F.linear(x, *self.v).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        if self.sdpa:  # HF's sdpa_attention_forward: no mask plane, is_causal for T > 1
            kwargs = {"enable_gqa": True} if self.gqa else {}
            if not self.gqa:
                k, v = self.repeat_kv(k, batch, tokens), self.repeat_kv(v, batch, tokens)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=tokens > 1, **kwargs)
            return F.linear(out.transpose(1, 2).contiguous().reshape(batch, tokens, -1), *self.o)
        k, v = self.repeat_kv(k, batch, tokens), self.repeat_kv(v, batch, tokens)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32)
        out = torch.matmul(probs, v).transpose(1, 2).contiguous().reshape(batch, tokens, -1)
        return F.linear(out, *self.o)

    def repeat_kv(self, x, batch, tokens):
        return x[:, :, None].expand(batch, self.kv_heads, self.groups, tokens, self.head_dim).reshape(
            batch, self.heads, tokens, self.head_dim)


def serve(layer, torch, stdin, stdout):
    """Answers the bench's requests, one line each, until `quit` or end of input:
    `run <T>` -> one forward at T tokens, `done <seconds>` (its own clock);
    `ping` -> `pong` (the bench times these to know what a request costs)."""
    inputs = {}
    for line in stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "ping":
            reply = "pong"
        elif words[0] == "run" and len(words) == 2 and words[1].isdigit() and int(words[1]) > 0:
            tokens = int(words[1])
            if tokens not in inputs:
                x = torch.rand(1, tokens, layer.hidden, generator=torch.Generator().manual_seed(1)) * 2 - 1
                inputs[tokens] = (x, *layer.model_inputs(tokens))
            start = time.perf_counter()
            layer.forward(*inputs[tokens])
            reply = f"done {time.perf_counter() - start:.6f}"
        else:
            reply = f"error unknown request {line.strip()!r}"
        stdout.write(reply + "\n")
        stdout.flush()


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as error:  # the bench prints the baseline as skipped
        print(f"unavailable {error}", flush=True)
        return 0
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}", flush=True)
    layer = Attention(torch, args)
    blas = next((item.split("=", 1)[1] for item in torch.__config__.show().replace(",", "\n").split()
                 if item.startswith("BLAS_INFO=")), "unknown")
    print(f"attention {'sdpa' if layer.sdpa else 'eager'} blas {blas}", flush=True)
    print("ready", flush=True)
    with torch.no_grad():
        serve(layer, torch, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
