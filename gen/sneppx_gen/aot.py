"""The AOT layer: one architecture as a self-contained, vendorable C file.

`plan()` decides the kernels (the same keys the runtime resolves for the
config, runtime/layer.c), `generate()` renders
    DIR/sneppx_<arch>.c, DIR/sneppx_<arch>.h,
    DIR/manifest.json and DIR/manifest.txt (one canonical key per line).
"""
import dataclasses
import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

from . import config_fields, config_json, render, runtime_names
from .archs import Arch
from .kernels import MASK_MODES, check_values, default_tiles, kernel_key, symbol_of_key
from .output import write_if_changed
from .tables import ROPE_TYPE_NAMES, c_double, c_value
from .targets import Target


@dataclass(frozen=True)
class Kernel:
    family: str
    values: Tuple[Tuple[str, int], ...]
    key: str
    symbol: str


@dataclass(frozen=True)
class WeightField:
    name: str
    rows: int
    cols: int = 0     # 0: a vector (bias)

    @property
    def shape(self) -> str:
        return f"[{self.rows}, {self.cols}]" if self.cols else f"[{self.rows}]"

    @property
    def floats(self) -> int:
        return self.rows * (self.cols or 1)


@dataclass(frozen=True)
class Plan:
    arch: Arch
    target: Target
    flash: bool
    kernels: Dict[str, Kernel]          # role -> kernel (roles may share one)
    dims: Dict[str, int]
    weight_fields: Tuple[WeightField, ...]
    kv_dtype: str = "float32"           # what the cached forward's caches hold (config_fields.DTYPES)

    @property
    def name(self) -> str:
        return "sneppx_" + self.arch.sanitized_name

    def unique_kernels(self) -> List[Kernel]:
        seen: Dict[str, Kernel] = {}
        for kernel in self.kernels.values():
            seen.setdefault(kernel.key, kernel)
        return list(seen.values())


def _kernel(family: str, values: Dict[str, int], target: Target) -> Kernel:
    check_values(family, values)
    key = kernel_key(family, values, target)
    return Kernel(family, tuple(values.items()), key, symbol_of_key(key))


def _gemm(arch: Arch, values: Dict[str, int], target: Target) -> Kernel:
    """A projection's GEMM, its panels of the arch's weight type; with bfloat16 compute
    (compute_dtype, bfloat16 weights only) the gemm_bf16dot kernel of bfloat16 pair panels."""
    if config_fields.DTYPES[arch.compute_dtype] == "bfloat16":
        return _kernel("gemm_bf16dot", values, target)
    values = dict(values, weight_type=arch.weight_dtype)
    return _kernel("gemm", dict(values, **default_tiles("gemm", target, arch.weight_dtype)), target)


def _attention_kernels(attention: str, head_dim: int, v_head_dim: int, group: int, window: int,
                       target: Target) -> Dict[str, Kernel]:
    values = {"head_dim": head_dim, "v_head_dim": v_head_dim, "group": group}
    return {
        "attention": _kernel(attention, dict(values, window=window, mask_mode=MASK_MODES.index("causal")),
                             target),
        # An explicit mask is final (HF semantics): no causal mask or window on top.
        "attention_mask": _kernel(attention, dict(values, window=0, mask_mode=MASK_MODES.index("mask")),
                                  target),
    }


def _weight_fields(specs) -> Tuple[WeightField, ...]:
    """(name, rows, cols, present) -> the fields that are present."""
    return tuple(WeightField(name, rows, cols) for name, rows, cols, present in specs if present)


def _plan_standard(arch: Arch, target: Target, attention: str) -> Tuple[Dict[str, Kernel], Dict[str, int],
                                                                           Tuple[WeightField, ...]]:
    head_dim = arch.resolved_head_dim
    q_dim = arch.num_attention_heads * head_dim
    kv_dim = arch.num_key_value_heads * head_dim
    hidden = arch.hidden_size
    dims = {"head_dim": head_dim, "v_head_dim": head_dim, "rotary_dim": arch.resolved_rotary_dim,
            "q_dim": q_dim, "kv_dim": kv_dim, "qkv_dim": q_dim + 2 * kv_dim, "attn_dim": q_dim,
            "attn_head_dim": head_dim, "attn_v_head_dim": head_dim, "attn_group": arch.group,
            "attn_kv_heads": arch.num_key_value_heads,
            # A token's row in the caller's K and V caches (the cached forward).
            "cache_k_dim": kv_dim, "cache_v_dim": kv_dim, "attn_window": arch.sliding_window}
    kernels = {
        "qkv": _gemm(arch, {"k": hidden, "n": dims["qkv_dim"], "bias": arch.qkv_bias}, target),
        "rope": _kernel("rope", {"rotary_dim": dims["rotary_dim"], "interleaved": arch.rope_interleaved},
                        target),
        **_attention_kernels(attention, head_dim, head_dim, arch.group, dims["attn_window"], target),
        "o": _gemm(arch, {"k": q_dim, "n": hidden, "bias": arch.o_bias}, target),
    }
    fields = _weight_fields((
        ("q_proj_weight", q_dim, hidden, True), ("q_proj_bias", q_dim, 0, arch.qkv_bias),
        ("k_proj_weight", kv_dim, hidden, True), ("k_proj_bias", kv_dim, 0, arch.qkv_bias),
        ("v_proj_weight", kv_dim, hidden, True), ("v_proj_bias", kv_dim, 0, arch.qkv_bias),
        ("o_proj_weight", hidden, q_dim, True), ("o_proj_bias", hidden, 0, arch.o_bias)))
    return kernels, dims, fields


def _plan_mla(arch: Arch, target: Target, attention: str) -> Tuple[Dict[str, Kernel], Dict[str, int],
                                                                      Tuple[WeightField, ...]]:
    """Absorbed MLA, as the runtime runs it: attention over the shared latent
    (one K/V head of dim kv_lora + rope, value dim kv_lora, all heads one group)."""
    heads, hidden, rank = arch.num_attention_heads, arch.hidden_size, arch.kv_lora_rank
    nope, rope, v_dim, q_lora = arch.qk_nope_head_dim, arch.qk_rope_head_dim, arch.v_head_dim, arch.q_lora_rank
    dq = nope + rope
    latent = rank + rope
    dims = {"head_dim": dq, "v_head_dim": v_dim, "rotary_dim": rope, "q_dim": heads * dq, "latent_dim": latent,
            "attn_dim": heads * v_dim, "attn_head_dim": latent, "attn_v_head_dim": rank, "attn_group": heads,
            "attn_kv_heads": 1,
            # One latent cache (K and V at once), no V cache.
            "cache_k_dim": latent, "cache_v_dim": 0, "attn_window": 0}
    kernels = {}
    if q_lora:
        kernels["q_a"] = _gemm(arch, {"k": hidden, "n": q_lora, "bias": arch.qkv_bias}, target)
        kernels["q_a_norm"] = _kernel("rmsnorm", {"n": q_lora}, target)
    kernels["q"] = _gemm(arch, {"k": q_lora or hidden, "n": dims["q_dim"], "bias": 0}, target)
    kernels["kv_a"] = _gemm(arch, {"k": hidden, "n": latent, "bias": arch.qkv_bias}, target)
    kernels["kv_a_norm"] = _kernel("rmsnorm", {"n": rank}, target)
    kernels["rope"] = _kernel("rope", {"rotary_dim": rope, "interleaved": arch.rope_interleaved}, target)
    kernels["absorb_uk"] = _gemm(arch, {"k": nope, "n": rank, "bias": 0}, target)
    kernels.update(_attention_kernels(attention, latent, rank, heads, dims["attn_window"], target))
    kernels["absorb_uv"] = _gemm(arch, {"k": rank, "n": v_dim, "bias": 0}, target)
    kernels["o"] = _gemm(arch, {"k": dims["attn_dim"], "n": hidden, "bias": arch.o_bias}, target)
    fields = _weight_fields((
        ("q_a_proj_weight", q_lora, hidden, bool(q_lora)),
        ("q_a_proj_bias", q_lora, 0, bool(q_lora) and arch.qkv_bias),
        ("q_a_layernorm_weight", q_lora, 0, bool(q_lora)),
        ("q_b_proj_weight", dims["q_dim"], q_lora, bool(q_lora)),
        ("q_proj_weight", dims["q_dim"], hidden, not q_lora),
        ("kv_a_proj_with_mqa_weight", latent, hidden, True),
        ("kv_a_proj_with_mqa_bias", latent, 0, arch.qkv_bias),
        ("kv_a_layernorm_weight", rank, 0, True),
        ("kv_b_proj_weight", heads * (nope + v_dim), rank, True),
        ("o_proj_weight", hidden, dims["attn_dim"], True),
        ("o_proj_bias", hidden, 0, arch.o_bias)))
    return kernels, dims, fields


def _decode_kernel(dims: Dict[str, int], kv_dtype: str, target: Target) -> Kernel:
    """The cached forward's attn_decode over caches of kv_dtype (causal, the arch's window), as
    the runtime resolves it for a KV cache of that dtype (runtime/layer.c)."""
    return _kernel("attn_decode", {"head_dim": dims["attn_head_dim"], "v_head_dim": dims["attn_v_head_dim"],
                                   "group": dims["attn_group"], "window": dims["attn_window"],
                                   "mask_mode": MASK_MODES.index("causal"),
                                   "kv_type": config_fields.DTYPES.index(kv_dtype)}, target)


def plan(arch: Arch, target: Target, flash: bool, kv_dtype: str = "float32") -> Plan:
    """The kernels, sizes and weight fields of the arch's layer, its cached forward over
    caches of kv_dtype. Raises ValueError for a key the kernels do not cover."""
    if kv_dtype not in config_fields.DTYPES:
        raise ValueError(f"kv_dtype: {kv_dtype!r} is not one of {', '.join(config_fields.DTYPES)}")
    attention = "attn_flash" if flash else "attn_sdpa"
    planner = _plan_mla if arch.is_mla else _plan_standard
    kernels, dims, fields = planner(arch, target, attention)
    if kv_dtype != "float32":
        # Narrow caches: decode-sized runs read them in place with attn_decode, widening in
        # registers, as the runtime does; the float32 layer attends in place with its
        # flash / SDPA kernel for every run.
        kernels["decode"] = _decode_kernel(dims, kv_dtype, target)
    return Plan(arch, target, flash, kernels, dims, fields, kv_dtype)


def _rope_initializer(arch: Arch, rotary_dim: int) -> str:
    """The designators of the arch's struct sneppx_rope_params (rope_params.j2): the config's
    RoPE fields, and every rope_scaling parameter of config_fields.py."""
    rs = arch.rope_scaling
    parts = [f".theta = {c_double(arch.rope_theta)}", f".rotary_dim = {rotary_dim}",
             f".max_position_embeddings = {arch.max_position_embeddings}"]
    parts += [f".{f.name} = {c_value(f, getattr(rs, f.name))}" for f in config_fields.ROPE_SCALING_FIELDS]
    lines, line = [], "   "
    for part in parts:
        if len(line) + len(part) + 2 > 100:
            lines.append(line)
            line = "   "
        line += f" {part},"
    return "\n".join(lines + [line.rstrip(",")])


def _float_literal(value: float) -> str:
    """(float)value, the runtime's rounding of the double, as a C literal that round-trips
    (9 significant digits). Rounded to float32 first: 9 digits of the double itself can
    cross a float32 midpoint, and the compiler's float nearest that decimal is then the
    other neighbour (MLA's 1 / sqrt(256 + 128) = 0.05103103630...: 0.0510310363f is the
    float below (float)(1 / sqrt(384.0)): a scale 1 ulp off the runtime's)."""
    text = f"{config_json.float32(value):.9g}"
    return text if any(c in text for c in ".e") else text + ".0"


_HEADER_ID_UNSET = "0x00000000"


# What stands for a config file's path in the regeneration options: the path is the
# user's, and a file must not change with the directory it was generated from.
CONFIG_PLACEHOLDER = "CONFIG.json"


def regeneration_options(p: Plan) -> List[str]:
    """The sneppx-gen options that render the plan's files again, every choice explicit
    (a default may change). A preset is named; a config's values are not in the options
    (its path stands as CONFIG_PLACEHOLDER), but in the files themselves."""
    if p.arch.family == "custom":
        source = ["--config", CONFIG_PLACEHOLDER, "--name", p.arch.name]
    else:
        preset = f"{p.arch.family}-{p.arch.size}"
        source = ["--arch", preset] + (["--name", p.arch.name] if p.arch.name != preset else [])
    return source + ["--target", p.target.name, "--flash" if p.flash else "--sdpa",
                     "--weight-dtype", config_fields.DTYPES[p.arch.weight_dtype],
                     "--compute-dtype", config_fields.DTYPES[p.arch.compute_dtype], "--kv-dtype", p.kv_dtype]


def render_layer(p: Plan) -> Tuple[str, str]:
    """(C source, header) of the plan."""
    kernels = [render.render_kernel(k.family, p.target, "aot", dict(k.values), standalone=False)
               for k in p.unique_kernels()]
    context = dict(
        mode="aot", a=p.arch, N=p.name, vw=p.target.vector_width, target=p.target, flash=p.flash, dims=p.dims,
        K={role: k.symbol for role, k in p.kernels.items()},
        keys=[k.key for k in p.unique_kernels()],
        kernels=kernels,
        weight_fields=p.weight_fields,
        rope_type=ROPE_TYPE_NAMES[p.arch.rope_scaling.type],
        weight_dtype=config_fields.DTYPES[p.arch.weight_dtype],
        compute_dtype=config_fields.DTYPES[p.arch.compute_dtype],
        kv_dtype=p.kv_dtype,
        kv_c_type=config_fields.DTYPE_C_TYPES[config_fields.DTYPES.index(p.kv_dtype)],
        kv_bytes=config_fields.DTYPE_BYTES[config_fields.DTYPES.index(p.kv_dtype)],
        rope_initializer=_rope_initializer(p.arch, p.dims["rotary_dim"]),
        rope_freqs=render.render_template("rope_freqs.c.j2", mode="aot"),
        softmax_scale=_float_literal(p.arch.softmax_scale()),
        softmax_scale_formula=config_json.softmax_scale_and_formula(p.arch)[1],
        pipeline_template="layer_mla.c.j2" if p.arch.is_mla else "layer_standard.c.j2",
        abi=render.render_abi(),
        options=" ".join(regeneration_options(p)),
        from_config=p.arch.family == "custom",
    )
    # The header's id, a digest of its text (rendered with a zero id), which the source
    # checks when it includes it: a header of another run under the same name (another
    # target, dtype or config) is a compile error, not sizes the source does not use.
    unmarked = render.render_template("layer.h.j2", header_id=_HEADER_ID_UNSET, **context)
    context["header_id"] = "0x" + hashlib.sha256(unmarked.encode()).hexdigest()[:8]
    return (render.render_template("layer.c.j2", **context),
            render.render_template("layer.h.j2", **context))


# A layer name no template writes: rendering under it tells the layer's own C names
# (sneppx_<name>_*, SNEPPX_<NAME>_*) from everything else the file holds.
_PROBE_NAME = "zz_name_probe_zz"
_C_NAME = re.compile(r"\b(?:sneppx|SNEPPX)_\w+")


def _layer_names(p: Plan) -> Tuple[Set[str], Set[str]]:
    """(the suffixes of the plan's own C names, lower case; every other sneppx_ / SNEPPX_
    name its files hold: the ABI's, the shared checks', the kernels')."""
    probe = dataclasses.replace(p, arch=dataclasses.replace(p.arch, name=_PROBE_NAME))
    source, header = render_layer(probe)
    lower, upper = f"sneppx_{_PROBE_NAME}_", f"SNEPPX_{_PROBE_NAME.upper()}_"
    own, others = set(), set()
    for name in _C_NAME.findall(source + header):
        if name.startswith(lower) or name.startswith(upper):
            own.add(name[len(lower):].lower())
        else:
            others.add(name)
    return own, others


def name_clash(p: Plan) -> Optional[str]:
    """Why the plan's name cannot be a layer's, or None. Its own names must not be another
    name the file holds (a layer named "gemm" would define sneppx_gemm_packed_floats beside
    the ABI's) or a macro of the runtime's headers (a layer named "max" would define
    limits.h's SNEPPX_MAX_HEAD_DIM), and a layer named <base>_<head> must not define a name
    of a layer named <base> (sneppx_x_cached_scratch_floats is layer x's
    cached_scratch_floats and layer x_cached's scratch_floats), so a name may not end in
    such a head."""
    own, others = _layer_names(p)
    name = p.arch.sanitized_name
    runtime = runtime_names.macros()
    for suffix in sorted(own):
        for taken in (f"sneppx_{name}_{suffix}", f"SNEPPX_{name.upper()}_{suffix.upper()}"):
            if taken in others:
                return f"the layer would define {taken}, which its file already has"
            if taken in runtime:  # a program includes the layer's header beside sneppx.h
                return f"the layer would define {taken}, which the runtime's headers define too"
    for suffix in sorted(own):
        for at in [i for i, c in enumerate(suffix) if c == "_"]:
            head, tail = suffix[:at], suffix[at + 1:]
            if tail in own and name.endswith("_" + head):
                base = name[:-len(head) - 1]
                return (f"its {tail} would be sneppx_{name}_{tail}, as the {suffix} of a layer named '{base}' "
                        f"is (a name may not end in '_{head}')")
    return None


def manifest(p: Plan) -> dict:
    return {
        "arch": p.arch.name,
        "target": p.target.name,
        "vector_width": p.target.vector_width,
        "attention": "flash" if p.flash else "sdpa",
        "weight_dtype": config_fields.DTYPES[p.arch.weight_dtype],
        "compute_dtype": config_fields.DTYPES[p.arch.compute_dtype],
        "kv_dtype": p.kv_dtype,
        "source": f"{p.name}.c",
        "header": f"{p.name}.h",
        "prefix": p.name,
        "options": regeneration_options(p),
        "keys": [k.key for k in p.unique_kernels()],
        "roles": {role: k.key for role, k in p.kernels.items()},
    }


def _check_manifest_is_ours(path: str, prefix: str) -> None:
    """A directory holds one layer's manifest: another layer's there would be replaced
    without a word (its key list lost), so that is refused; this layer's is rewritten."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    other = None
    # Not a regular file (a FIFO, whose open would block forever; a device): not a manifest.
    # A directory there is named by open's error, as for the layer's other files.
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        try:
            with open(path, encoding="utf-8") as stream:
                other = json.load(stream).get("prefix")
        except (ValueError, AttributeError):
            pass
    if other != prefix:
        described = f"layer {other}'s" if isinstance(other, str) else "not a manifest sneppx-gen wrote"
        raise ValueError(f"{path} is {described}: generate {prefix} into a directory of its own (-o)")


def generate(arch: Arch, out_dir: str, target: Target, flash: bool, kv_dtype: str = "float32") -> List[str]:
    """Writes the layer files into out_dir (created if needed), the cached forward's caches
    holding kv_dtype; returns their paths.
    Raises ValueError for an arch the vendored layer does not cover, whose name would
    take the runtime's or another layer's C names, or when out_dir holds another layer's
    manifest; OSError naming the path on I/O (out_dir not a directory included)."""
    taken = runtime_names.collision(arch.sanitized_name)
    if taken:
        raise ValueError(f"the layer's C names would be sneppx_{arch.sanitized_name}_*, as the runtime's "
                         f"{taken} is: choose another name (--name)")
    p = plan(arch, target, flash, kv_dtype)
    clash = name_clash(p)
    if clash:
        raise ValueError(f"the layer's C names would be sneppx_{arch.sanitized_name}_*: {clash}: choose another "
                         "name (--name)")
    source, header = render_layer(p)
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        # A file, or a dangling link os.makedirs would take for a directory that exists.
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), out_dir)
    _check_manifest_is_ours(os.path.join(out_dir, "manifest.json"), p.name)
    os.makedirs(out_dir, exist_ok=True)
    files = {
        f"{p.name}.c": source,
        f"{p.name}.h": header,
        "manifest.json": json.dumps(manifest(p), indent=2) + "\n",
        "manifest.txt": "".join(k.key + "\n" for k in p.unique_kernels()),
    }
    written = []
    for name, text in files.items():
        path = os.path.join(out_dir, name)
        write_if_changed(path, text)
        written.append(path)
    return written
