#!/usr/bin/python3
"""Derives a lean LLVM pass pipeline for one kernel family: default<O2> (as
LLVM prints it) without every pass whose removal leaves the optimized IR of a
sample of the family's keys the same, for both targets.

    scripts/derive_jit_pipeline.py BUILD_DIR FAMILY [--jobs N]

Each pass of the printed pipeline is dropped in turn, and the drop is kept
when every sample key's IR, through the runtime's own path (sneppx-ir
--passes), equals its IR under default<O2> (the JIT numbers values rather
than naming them, so passes that only name things differently do not
count). Prints the pipeline; put it in
gen/sneppx_gen/jit_pipelines.py (with readable line breaks). Takes minutes:
each try runs sneppx-ir once per sample key. Where the printed pipeline does
not reproduce default<O2>, the first pass whose drop does is dropped first; a
family for which none does is refused.
"""
import argparse
import itertools
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

# Sample keys per family: every choice field's values and the shapes the
# presets use, plus odd ones (heads of 32..576 dims, groups 1..16).
SAMPLES = {
    "attn_flash": [dict(head_dim=d, v_head_dim=dv, group=g, window=w, mask_mode=m)
                   for (d, dv, g), w, m in itertools.product(
                       ((128, 128, 4), (128, 128, 7), (128, 128, 1), (128, 128, 16), (64, 64, 8), (576, 512, 16),
                        (96, 96, 5), (192, 128, 1), (256, 256, 2), (32, 32, 3)),
                       (0, 1024), ("none", "causal", "mask"))],
    "attn_decode": [dict(head_dim=d, v_head_dim=dv, group=g, window=w, mask_mode=m, kv_type=t)
                    for (d, dv, g), (w, m), t in itertools.product(
                        ((128, 128, 4), (576, 512, 16), (80, 80, 3)), ((0, "causal"), (0, "mask"), (512, "causal")),
                        ("float32", "bfloat16", "float16", "int8"))],
    "attn_sdpa": [dict(head_dim=d, v_head_dim=dv, group=g, window=w, mask_mode=m)
                  for (d, dv, g), w, m in itertools.product(
                      ((128, 128, 4), (576, 512, 16), (80, 80, 3), (64, 64, 8), (256, 256, 1), (96, 96, 2),
                       (192, 128, 1)), (0, 512, 1024), ("none", "causal", "mask"))],
    "gemm": [dict(k=k, n=n, bias=b, weight_type=t)
             for (k, n), b, t in itertools.product(((4096, 6144), (2048, 576), (3584, 4608), (128, 512)), (0, 1),
                                                   ("float32", "bfloat16", "float16", "int8"))],
}
TARGETS = ("v16", "v8")


def split_passes(text):
    """The (start, end) spans of the leaf passes in a pipeline text."""
    spans, i = [], 0
    while i < len(text):
        if text[i] in ",()":
            i += 1
            continue
        j, angle = i, 0
        while j < len(text) and (angle or text[j] not in ",()"):
            angle += {"<": 1, ">": -1}.get(text[j], 0)
            j += 1
        if j < len(text) and text[j] == "(":  # a pass manager or adaptor, not a leaf
            i = j
            continue
        spans.append((i, j))
        i = j
    return spans


def without(text, spans):
    """text without the passes at spans, and without the adaptors that leaves empty."""
    for start, end in sorted(spans, reverse=True):
        if end < len(text) and text[end] == ",":
            end += 1
        elif start > 0 and text[start - 1] == ",":
            start -= 1
        text = text[:start] + text[end:]
    while True:
        shorter = re.sub(r"[\w-]+(<[^()]*>)?\(\)", "", text)
        shorter = re.sub(r",,+", ",", shorter).replace("(,", "(").replace(",)", ")").strip(",")
        if shorter == text:
            return text
        text = shorter


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("family", choices=sorted(SAMPLES))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    ir_tool = os.path.join(args.build_dir, "runtime", "sneppx-ir")
    keys = [(values, target) for values in SAMPLES[args.family] for target in TARGETS]

    def ir(values, target, passes):
        command = [ir_tool, "--family", args.family, "--target", target, "--passes", passes]
        for name, value in values.items():
            command += ["--value", f"{name}={value}"]
        run = subprocess.run(command, capture_output=True, text=True)
        return run.stdout if run.returncode == 0 else None

    with ThreadPoolExecutor(args.jobs) as pool:
        reference = list(pool.map(lambda key: ir(*key, "default<O2>"), keys))
        if None in reference:
            sys.exit(f"derive_jit_pipeline: sneppx-ir failed on a sample key of {args.family}")

        def same(passes):
            for start in range(0, len(keys), args.jobs):
                batch = range(start, min(start + args.jobs, len(keys)))
                if any(got != reference[i] for i, got in zip(batch, pool.map(lambda i: ir(*keys[i], passes), batch))):
                    return False
            return True

        printed = subprocess.run(["opt-19", "-passes=default<O2>", "-print-pipeline-passes", "-disable-output"],
                                 input="", capture_output=True, text=True, check=True).stdout.strip()
        printed = printed.replace(",verify", "").replace(",BitcodeWriterPass", "")
        dropped = []
        if not same(printed):
            # LLVM prints some passes without options their parsed form then
            # lacks (the function simplification's vector-combine is early-folds
            # only, printed as the full one): the first single drop that gives
            # default<O2>'s IR is where paring starts.
            first = next((span for span in split_passes(printed) if same(without(printed, [span]))), None)
            if first is None:
                sys.exit(f"derive_jit_pipeline: the printed default<O2> does not reproduce it on {args.family}'s "
                         "keys, nor does it without any one pass")
            dropped.append(first)
            print(f"dropped {printed[first[0]:first[1]]} (the printed pipeline differs with it)", file=sys.stderr,
                  flush=True)
        for span in split_passes(printed):
            if span not in dropped and same(without(printed, dropped + [span])):
                dropped.append(span)
                print(f"dropped {printed[span[0]:span[1]]}", file=sys.stderr, flush=True)
    print(without(printed, dropped))


if __name__ == "__main__":
    main()
