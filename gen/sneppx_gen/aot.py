"""The AOT layer: one architecture as a self-contained, vendorable C file.

`plan()` decides the kernels (the same keys the runtime resolves for the
config, runtime/layer.c), `generate()` renders
    DIR/sneppx_<arch>.c, DIR/sneppx_<arch>.h,
    DIR/manifest.json and DIR/manifest.txt (one canonical key per line).
"""
import json
import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

from . import render
from .archs import Arch, ROPE_TYPES
from .kernels import MASK_MODES, kernel_key, symbol_of_key
from .output import write_if_changed
from .tables import ROPE_TYPE_NAMES, c_double


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
    vector_width: int
    flash: bool
    kernels: Dict[str, Kernel]          # role -> kernel (roles may share one)
    dims: Dict[str, int]
    weight_fields: Tuple[WeightField, ...]

    @property
    def name(self) -> str:
        return "sneppx_" + self.arch.sanitized_name

    def unique_kernels(self) -> List[Kernel]:
        seen: Dict[str, Kernel] = {}
        for kernel in self.kernels.values():
            seen.setdefault(kernel.key, kernel)
        return list(seen.values())


def _kernel(family: str, values: Dict[str, int], vector_width: int) -> Kernel:
    render.check_values(family, values)
    key = kernel_key(family, values, vector_width)
    return Kernel(family, tuple(values.items()), key, symbol_of_key(key))


def plan(arch: Arch, vector_width: int, flash: bool) -> Plan:
    """Raises ValueError for what the vendored layer does not cover."""
    if arch.is_mla:
        raise ValueError("the vendored layer covers standard attention (Llama, Mistral, Qwen 2); "
                         "MLA (DeepSeek V2) runs in the runtime")
    head_dim = arch.resolved_head_dim
    q_dim = arch.num_attention_heads * head_dim
    kv_dim = arch.num_key_value_heads * head_dim
    dims = {"head_dim": head_dim, "v_head_dim": head_dim, "rotary_dim": arch.resolved_rotary_dim,
            "q_dim": q_dim, "kv_dim": kv_dim, "qkv_dim": q_dim + 2 * kv_dim, "attn_dim": q_dim}
    attention = "attn_flash" if flash else "attn_sdpa"
    attn_values = {"head_dim": head_dim, "v_head_dim": head_dim, "group": arch.group}
    kernels = {
        "qkv": _kernel("gemm", {"k": arch.hidden_size, "n": dims["qkv_dim"], "bias": arch.qkv_bias}, vector_width),
        "rope": _kernel("rope", {"rotary_dim": dims["rotary_dim"], "interleaved": arch.rope_interleaved},
                        vector_width),
        "attention": _kernel(attention, dict(attn_values, window=arch.sliding_window,
                                             mask_mode=MASK_MODES.index("causal")), vector_width),
        # An explicit mask is final (HF semantics): no causal mask or window on top.
        "attention_mask": _kernel(attention, dict(attn_values, window=0, mask_mode=MASK_MODES.index("mask")),
                                  vector_width),
        "o": _kernel("gemm", {"k": dims["attn_dim"], "n": arch.hidden_size, "bias": arch.o_bias}, vector_width),
    }
    hidden = arch.hidden_size
    fields = []
    for name, rows, cols, has_bias in (("q_proj", q_dim, hidden, arch.qkv_bias), ("k_proj", kv_dim, hidden, arch.qkv_bias),
                                       ("v_proj", kv_dim, hidden, arch.qkv_bias), ("o_proj", hidden, q_dim, arch.o_bias)):
        fields.append(WeightField(f"{name}_weight", rows, cols))
        if has_bias:
            fields.append(WeightField(f"{name}_bias", rows))
    return Plan(arch, vector_width, flash, kernels, dims, tuple(fields))


def _rope_literals(arch: Arch) -> Dict[str, str]:
    rs = arch.rope_scaling
    return {
        "type": ROPE_TYPE_NAMES[rs.type],
        "theta": c_double(arch.rope_theta),
        "factor": c_double(rs.factor),
        "low_freq_factor": c_double(rs.low_freq_factor),
        "high_freq_factor": c_double(rs.high_freq_factor),
        "original_max_position_embeddings": str(rs.original_max_position_embeddings),
        "beta_fast": c_double(rs.beta_fast),
        "beta_slow": c_double(rs.beta_slow),
        "mscale": c_double(rs.mscale),
        "mscale_all_dim": c_double(rs.mscale_all_dim),
        "attention_factor": c_double(rs.attention_factor),
    }


def _float_literal(value: float) -> str:
    """The float nearest to value, as a C literal that round-trips (9 significant digits)."""
    return f"{value:.9g}" if any(c in f"{value:.9g}" for c in ".e") else f"{value:.9g}.0"


def render_layer(p: Plan) -> Tuple[str, str]:
    """(C source, header) of the plan."""
    kernels = [render.render_kernel(k.family, p.vector_width, "aot", dict(k.values), standalone=False)
               for k in p.unique_kernels()]
    context = dict(
        mode="aot", a=p.arch, N=p.name, vw=p.vector_width, flash=p.flash, dims=p.dims,
        K={role: k.symbol for role, k in p.kernels.items()},
        keys=[k.key for k in p.unique_kernels()],
        kernels=kernels,
        weight_fields=p.weight_fields,
        rope=_rope_literals(p.arch),
        rope_freqs=render.render_template("rope_freqs.c.j2", mode="aot"),
        softmax_scale=_float_literal(p.arch.softmax_scale()),
        abi=render.render_abi(),
    )
    return (render.render_template("layer.c.j2", **context),
            render.render_template("layer.h.j2", **context))


def manifest(p: Plan) -> dict:
    return {
        "arch": p.arch.name,
        "vector_width": p.vector_width,
        "attention": "flash" if p.flash else "sdpa",
        "source": f"{p.name}.c",
        "header": f"{p.name}.h",
        "prefix": p.name,
        "keys": [k.key for k in p.unique_kernels()],
        "roles": {role: k.key for role, k in p.kernels.items()},
    }


def generate(arch: Arch, out_dir: str, vector_width: int, flash: bool) -> List[str]:
    """Writes the layer files into out_dir (created if needed); returns their paths.
    Raises ValueError for an arch the vendored layer does not cover, OSError on I/O."""
    p = plan(arch, vector_width, flash)
    source, header = render_layer(p)
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
