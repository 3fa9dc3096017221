"""Rendering kernel templates in `aot` or `jit` mode.

One template per kernel family (kernels.KERNELS). The mode switch lives in
templates/spec.j2; this module supplies what it reads: `S` (the key's fields),
`P` (helper prefix), `entry()` (entry point names), `target` (the
instruction-set target: vector width and register tiles, targets.py), the ABI
text, and the `c_comment` filter every text from outside the templates passes
through on its way into a comment.
"""
import json
import math
from typing import Dict, Optional, Union

import jinja2

from . import config_fields, limits, paths
from .kernels import KERNELS, Kernel, check_values, kernel_key, symbol_of_key
from .targets import PACKED_ELEMENTS, TARGETS, Target

MODES = ("aot", "jit")


class Spec:
    """The specialization fields of one kernel as the template sees them.

    aot: values known, `S.head_dim` is the literal and the render-time tests
    `may`/`is_` decide. jit: values unknown, `S.head_dim` is `spec_head_dim`
    and both tests return True so the template keeps the C condition.
    """

    def __init__(self, kernel: Kernel, values: Optional[Dict[str, int]]):
        self._kernel = kernel
        self._fields = {f.name: f for f in kernel.fields}
        self._values = values

    def names(self):
        return [f.name for f in self._kernel.fields]

    def __getattr__(self, name: str) -> str:
        if name.startswith("_") or name not in self._fields:
            raise AttributeError(f"{self._kernel.family} has no key field {name!r}")
        if self._values is None:
            return f"spec_{name}"
        return str(int(self._values[name]))

    def _value_of(self, name: str, value: Union[int, str]) -> int:
        field = self._fields[name]
        if isinstance(value, str):
            return field.choices.index(value)
        return int(value)

    def may(self, name: str) -> bool:
        """False only when the aot value is 0 (the feature is off)."""
        if name not in self._fields:
            raise KeyError(name)
        return self._values is None or int(self._values[name]) != 0

    def code(self, name: str, value: str) -> str:
        """The C value of a choice field's choice (kv_type "int8" is "3"), rendered from
        the field's list of choices, for the jit mode's tests of spec_<name>."""
        return str(self._value_of(name, value))

    def is_(self, name: str, value: Union[int, str]) -> bool:
        """False only when the aot value differs from value (a choice name or int)."""
        wanted = self._value_of(name, value)
        return self._values is None or int(self._values[name]) == wanted


def c_branch(keep_test: bool, test: str, depth: int, body: str, braces: bool) -> str:
    """spec.j2's branch: body under `if (test)` at depth spaces, or (keep_test False) the
    body alone, each line one level (4 spaces) out."""
    if not keep_test:
        return "".join(line[4:] if line.startswith("    ") else line for line in body.splitlines(keepends=True))
    pad = " " * depth
    if not braces:
        return f"{pad}if ({test})\n{body}"
    return f"{pad}if ({test}) {{\n{body}{pad}}}\n"


def c_comment(text: object) -> str:
    """Text for inside a /* */ comment of generated C: printable ASCII that neither ends
    the comment ("*/") nor opens one ("/*", which -Wcomment reports). The readers already
    refuse such names; this refuses whatever reaches a comment without them (ValueError)."""
    text = str(text)
    if "*/" in text or "/*" in text or any(not " " <= c <= "~" for c in text):
        shown = text[:32] + ("..." if len(text) > 32 else "")
        raise ValueError(f"{json.dumps(shown)} cannot stand in a C comment (printable ASCII only, "
                         f"without '*/' or '/*')")
    return text


_environment: Optional[jinja2.Environment] = None


def environment() -> jinja2.Environment:
    global _environment
    if _environment is None:
        _environment = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(paths.TEMPLATE_DIR)),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            autoescape=False,
        )
        _environment.filters["c_comment"] = c_comment
        _environment.globals["c_branch"] = c_branch
        # The RoPE types by value (rope_freqs.c.j2's enum), from the config field list.
        _environment.globals["rope_types"] = config_fields.ROPE_TYPES
        # sneppx_rope_scaling's parameters (rope_params.j2's struct sneppx_rope_params).
        _environment.globals["rope_parameters"] = config_fields.ROPE_PARAMETERS
        # Each element type's size in bytes, by its value (config_fields.DTYPES' order).
        _environment.globals["dtype_bytes"] = config_fields.DTYPE_BYTES
        # Elements per 32-bit lane of the cache types attn_decode can read packed.
        _environment.globals["packed_elements"] = PACKED_ELEMENTS
        # The bounds of limits.py (forward_checks.h.j2), as sneppx/limits.h has them.
        _environment.globals["limits"] = limits
    return _environment


def render_template(name: str, **context) -> str:
    return environment().get_template(name).render(**context)


def render_abi() -> str:
    return render_template("abi.h.j2", targets=TARGETS, dtypes=config_fields.DTYPES,
                           dtype_bytes=config_fields.DTYPE_BYTES,
                           gemm_mr_lcm=math.lcm(*(t.gemm_mr for t in TARGETS)))


def render_kernel(family: str, target: Target, mode: str,
                  values: Optional[Dict[str, int]] = None, standalone: bool = True) -> str:
    """Renders one kernel. aot needs values; jit takes none (they are globals).

    standalone=True puts the ABI and the vector layer above the kernel (every
    jit source, single-kernel files); the aot layer file emits them once and
    passes standalone=False. Raises KeyError for an unknown family and
    ValueError for a bad mode or key.
    """
    kernel = KERNELS[family]
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if mode == "aot":
        if values is None:
            raise ValueError(f"{family}: aot rendering needs the key's values")
        check_values(family, values)
        key = kernel_key(family, values, target)
        prefix = symbol_of_key(key)
        entry_prefix = prefix
        spec_values = values
    else:
        key = family
        prefix = f"sneppx_{family}"
        entry_prefix = "sneppx_kernel"
        spec_values = None
    return render_template(
        kernel.template,
        mode=mode,
        family=family,
        template=kernel.template,
        key=key,
        target=target,
        vw=target.vector_width,
        S=Spec(kernel, spec_values),
        P=prefix,
        entry=lambda suffix: entry_prefix + suffix,
        standalone=standalone,
        abi=render_abi() if standalone else "",
    )
