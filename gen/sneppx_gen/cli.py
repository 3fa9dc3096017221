"""The sneppx-gen command line.

    sneppx-gen --list
    sneppx-gen --arch NAME [--name NAME] -o DIR [--target NAME|--vector-width W] [--flash|--sdpa]
                                     [--weight-dtype T] [--compute-dtype T] [--kv-dtype T]
    sneppx-gen --config PATH [--name NAME] -o DIR [same options]
                                     (W: a target's vector width, targets.py)
                                     (an HF config.json, read as the runtime reads it,
                                     or a hand config: see config_json.py)
    sneppx-gen build ...             (the build's subcommands, see build.py)

Exit status: 0 on success, 2 on a usage error or an unknown architecture,
1 when a config cannot be generated (one line on stderr naming the file and the
field, in the runtime's words).
"""
import argparse
import dataclasses
import sys
from typing import List

from . import archs, build, config_fields
from .echo import clip
from .targets import (TARGET_NAMES, TARGETS, VECTOR_WIDTHS, Target, cpuinfo_flags, host_target, target_named,
                      target_of_width)

EXIT_USAGE = 2
EXIT_FAILED = 1


def host_cpu_target() -> Target:
    """The host's target, from /proc/cpuinfo's flags (what libsneppx picks from
    LLVM's feature list); the fallback target without them."""
    return host_target(cpuinfo_flags())


class _Once(argparse.Action):
    """An option that may be given once: argparse keeps the last of repeated values, which
    would write one of two outputs, or one of two architectures, without a word."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        if before is not None:
            parser.error(f"{'/'.join(self.option_strings)} given twice ({clip(str(before))!r} and "
                         f"{clip(str(values))!r}); give it once")
        setattr(namespace, self.dest, values)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sneppx-gen",
        description="Generate specialized attention kernels as a self-contained C file.",
        epilog="Build-time subcommands: sneppx-gen build --help")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="list the architecture presets")
    what.add_argument("--arch", metavar="NAME", action=_Once, help='preset name, case-insensitive ("llama3-8B", "mistral-7B")')
    what.add_argument("--config", metavar="PATH", action=_Once, help="an HF config.json (with model_type), or the checkpoint directory "
                      "holding it, read as libsneppx reads it; without model_type, a hand config (sneppx.LLMConfig's "
                      "keywords, + rotary_dim and the presets' informational keys; any other key is refused)")
    parser.add_argument("--name", metavar="NAME", action=_Once, help="the layer's name (its files are sneppx_<name>.c/.h, "
                        "its functions sneppx_<name>_*; two copies of one preset, for two targets, need two names); "
                        "default: the preset's, or the config's \"name\", else the checkpoint directory's name")
    parser.add_argument("-o", "--output", metavar="DIR", action=_Once, help="output directory")
    parser.add_argument("--weight-dtype", choices=config_fields.WEIGHT_DTYPES, default=None, action=_Once,
                        help="storage type of the projections' packed weights (default: the config's, float32); "
                             "bfloat16 / float16 halve them, products accumulate in float32")
    parser.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default=None, action=_Once,
                        help="what the projections multiply in (default: the config's, float32); bfloat16 "
                             "(with bfloat16 weights) rounds their inputs to bfloat16 for vdpbf16ps, ~2x the "
                             "rate on AMD Zen 4/5 (0.7x on an Intel Xeon whose vdpbf16ps issues a quarter as often "
                             "as an FMA), on CPUs with AVX512_BF16 (at v16 the only ones the file then runs on; at v8 it runs the "
                             "same sums as float32 FMAs, on any CPU)")
    parser.add_argument("--kv-dtype", choices=config_fields.DTYPES, default=None, action=_Once,
                        help="what the KV caches of the cached forward (_forward_cached) hold, which the caller "
                             "allocates (default float32): bfloat16 / float16 halve the bytes a decode step reads, "
                             "int8 (a float32 scale per token and K/V head) quarters them; rounded as libsneppx's "
                             "KV cache of that dtype rounds")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--target", choices=TARGET_NAMES, default=None, action=_Once,
                        help="the instruction-set target (default: the host's, the first of "
                             + ", ".join(f"{t.name} ({' '.join(t.cpuinfo_flags) or 'any CPU'})" for t in TARGETS)
                             + " it runs)")
    target.add_argument("--vector-width", type=int, choices=VECTOR_WIDTHS, default=None, action=_Once,
                        help="floats per vector: the first target of that width (--target names one)")
    attention = parser.add_mutually_exclusive_group()
    attention.add_argument("--flash", dest="flash", action="store_true", default=None,
                           help="flash attention (default unless the config says otherwise)")
    attention.add_argument("--sdpa", dest="flash", action="store_false", help="materialized SDPA")
    return parser


def _list_presets() -> int:
    for arch in archs.load_presets():
        s = archs.preset_summary(arch)
        line = (f"{arch.name:<20} hidden={s['hidden']} heads={s['heads']} kv_heads={s['kv_heads']} "
                f"head_dim={s['head_dim']} window={s['window']} bias={s['bias']}")
        if arch.is_mla:
            line += (f" mla(kv_lora={arch.kv_lora_rank} q_lora={arch.q_lora_rank} "
                     f"rope={arch.qk_rope_head_dim} v={arch.v_head_dim})")
        if arch.aliases:
            line += f" aliases={','.join(arch.aliases)}"
        print(line)
    return 0


def main(argv: List[str]) -> int:
    if argv and argv[0] == "build":
        return build.main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        return _list_presets()
    if args.output is None:
        parser.error("-o DIR is required with --arch and --config")
    if not args.output:
        parser.error("-o: an empty path; give a directory")   # said -o was required, though given
    if args.config == "":
        # Path("") is ".": an unset variable would read whatever config.json the working directory holds.
        parser.error("--config: an empty path; give a config.json or its checkpoint directory")
    try:
        if args.arch:
            presets = archs.load_presets()
            arch = archs.find_preset(args.arch, presets)
            if arch is None:
                print(f"sneppx-gen: unknown architecture '{clip(args.arch)}'; valid names: "
                      + ", ".join(a.name for a in presets), file=sys.stderr)
                return EXIT_USAGE
            if args.name is not None:
                arch = archs.renamed(arch, args.name)
        else:
            arch = archs.load_config_file(args.config, args.name)
    except (OSError, ValueError) as error:
        print(f"sneppx-gen: {error}", file=sys.stderr)
        return EXIT_FAILED
    from . import aot
    flash = bool(arch.use_flash_attn) if args.flash is None else args.flash
    if args.weight_dtype is not None:
        arch = dataclasses.replace(arch, weight_dtype=config_fields.DTYPES.index(args.weight_dtype))
    if args.compute_dtype is not None:
        arch = dataclasses.replace(arch, compute_dtype=config_fields.DTYPES.index(args.compute_dtype))
    if config_fields.DTYPES[arch.compute_dtype] == "bfloat16" and config_fields.DTYPES[arch.weight_dtype] != "bfloat16":
        # Either side may be the config's (its reader refuses the pair only within the file):
        # name the option or the file each came from.
        weights = config_fields.DTYPES[arch.weight_dtype]
        compute = "--compute-dtype bfloat16" if args.compute_dtype else f"{args.config}: compute_dtype bfloat16"
        given = f"--weight-dtype {weights}" if args.weight_dtype else weights
        print(f"sneppx-gen: {compute} needs bfloat16 weights (--weight-dtype bfloat16), not {given}", file=sys.stderr)
        return EXIT_USAGE
    if args.target:
        target = target_named(args.target)
    elif args.vector_width:
        target = target_of_width(args.vector_width)
    else:
        target = host_cpu_target()
    try:
        written = aot.generate(arch, args.output, target, flash, args.kv_dtype or "float32")
    except OSError as error:
        path = f"{error.filename}: " if error.filename and error.filename != args.output else ""
        print(f"sneppx-gen: {arch.name}: -o {args.output}: {path}{error.strerror or error}",
              file=sys.stderr)
        return EXIT_FAILED
    except ValueError as error:
        print(f"sneppx-gen: {arch.name}: {error}", file=sys.stderr)
        return EXIT_FAILED
    for path in written:
        print(path)
    return 0
