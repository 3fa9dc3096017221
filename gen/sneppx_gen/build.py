"""`sneppx-gen build ...`: what the CMake build asks the generator for.

    build abi -o FILE                 the kernel ABI header
    build presets -o FILE             the runtime preset table (gen/archs.json)
    build config-fields -o FILE       the C check of include/sneppx/config.h against config_fields.py
    build python-fields -o FILE       the Python package's config structs (sneppx/_config_fields.py)
    build rope-freqs -o FILE          RoPE frequency code for libsneppx
    build rope-freqs-header -o FILE   its header (struct sneppx_rope_params from config_fields.py)
    build model-types -o FILE         the config.json model-type table (model_types.py)
    build limits -o FILE              the public sneppx/limits.h
    build config-ranges -o FILE       the config range table of runtime/config.c
    build families                    family names, ';'-separated (a CMake list)
    build targets                     the names of the targets kernels are built for
                                      (targets.py, a CMake list)
    build jit-source --family F --target NAME -o FILE
    build aot-source --family F --target NAME --value NAME=V ... -o FILE
                                      one key's kernel alone, values as literals (a choice
                                      field takes its name: mask_mode=causal; a GEMM's kc and
                                      mc default to the target's)
    build kernel-table --bitcode FAMILY:TARGET:PATH ... -o FILE
"""
import argparse
import sys
from typing import Dict, List

from . import archs, python_fields, render, tables
from .kernels import KERNELS, default_tiles
from .targets import TARGET_NAMES, target_named
from .output import write_if_changed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sneppx-gen build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("abi", "presets", "config-fields", "python-fields", "rope-freqs", "rope-freqs-header", "model-types",
                 "limits", "config-ranges"):
        sub.add_parser(name).add_argument("-o", "--output", required=True)
    sub.add_parser("families")
    sub.add_parser("targets")
    jit = sub.add_parser("jit-source")
    jit.add_argument("--family", required=True, choices=sorted(KERNELS))
    jit.add_argument("--target", required=True, choices=TARGET_NAMES)
    jit.add_argument("-o", "--output", required=True)
    aot = sub.add_parser("aot-source")
    aot.add_argument("--family", required=True, choices=sorted(KERNELS))
    aot.add_argument("--target", required=True, choices=TARGET_NAMES)
    aot.add_argument("--value", action="append", default=[], metavar="NAME=V")
    aot.add_argument("-o", "--output", required=True)
    table = sub.add_parser("kernel-table")
    table.add_argument("--bitcode", action="append", default=[], metavar="FAMILY:TARGET:PATH")
    table.add_argument("-o", "--output", required=True)
    return parser


def _key_values(family: str, pairs: List[str]) -> Dict[str, int]:
    """--value NAME=V pairs as a key's values; ValueError naming the pair at fault."""
    fields = {f.name: f for f in KERNELS[family].fields}
    values: Dict[str, int] = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        if name not in fields:
            raise ValueError(f"--value {pair}: {family} has no field {name!r} ({', '.join(fields)})")
        if name in values:
            raise ValueError(f"--value {pair}: {name} is given twice")
        choices = fields[name].choices
        try:
            values[name] = choices.index(text) if choices and text in choices else int(text)
        except ValueError:
            raise ValueError(f"--value {pair}: {text!r} is not an integer"
                             + (f" or one of {', '.join(choices)}" if choices else "")) from None
    return values


def main(argv: List[str]) -> int:
    args = _parser().parse_args(argv)
    if args.what == "families":
        print(";".join(KERNELS))
        return 0
    if args.what == "targets":
        print(";".join(TARGET_NAMES))
        return 0
    if args.what == "abi":
        text = render.render_abi()
    elif args.what == "presets":
        text = tables.presets_table(archs.load_presets())
    elif args.what == "limits":
        text = tables.limits_header()
    elif args.what == "config-ranges":
        text = tables.config_ranges_table()
    elif args.what == "config-fields":
        text = tables.config_fields_c()
    elif args.what == "python-fields":
        text = python_fields.render()
    elif args.what == "rope-freqs":
        text = render.render_template("rope_freqs.c.j2", mode="runtime")
    elif args.what == "rope-freqs-header":
        text = render.render_template("rope_freqs.h.j2", mode="runtime")
    elif args.what == "model-types":
        text = tables.model_types_c()
    elif args.what == "jit-source":
        text = render.render_kernel(args.family, target_named(args.target), "jit")
    elif args.what == "aot-source":
        try:
            values = _key_values(args.family, args.value)
            target = target_named(args.target)
            # Tile fields not given (a GEMM's kc, mc) are the target's defaults.
            defaults = default_tiles(args.family, target, values.get("weight_type", 0))
            text = render.render_kernel(args.family, target, "aot", dict(defaults, **values))
        except ValueError as error:
            print(f"sneppx-gen build aot-source: {error}", file=sys.stderr)
            return 1
    else:
        bitcodes = []
        for spec in args.bitcode:
            family, target, path = tables.parse_bitcode_spec(spec)
            with open(path, "rb") as f:
                bitcodes.append((family, target, f.read()))
        text = tables.kernel_table(bitcodes)
    try:
        write_if_changed(args.output, text)
    except OSError as error:
        print(f"sneppx-gen build {args.what}: -o {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    return 0
