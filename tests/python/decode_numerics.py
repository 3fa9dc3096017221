"""How attn_decode computes over an int8 KV cache on a target, for the tests' tolerances.

A target whose decode_int8_dot is set (gen/sneppx_gen/targets.py) reads int8 caches by
integer dot products: queries rounded to int16 in units of a row's largest / 32767, and a
64-key tile's probabilities times their V scales the same per row. Each product then
carries up to 2^-16 of its row's largest term beside float32's rounding, and the units
follow the tiles, so key ranges (split-KV on two threads) regroup them. tests/
test_attn_decode.c measured up to 5.4e-5 max-normalized against float64 and 4.5e-5
between split and unsplit calls; the rows' own int8 rounding is 1/254 of their largest
element.
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gen"))
from sneppx_gen import targets  # noqa: E402

INT16_DOT_MAX_NORMALIZED = 2e-4


def process_target(name=None):
    """The target this process's kernels are built for: name, else SNEPPX_TARGET, else the host's."""
    name = name or os.environ.get("SNEPPX_TARGET")
    if name:
        return next(t for t in targets.TARGETS if t.name == name)
    with open("/proc/cpuinfo") as cpuinfo:
        flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    return targets.host_target(flags)


def int16_dot(dtype, target=None):
    """Whether attn_decode reads a cache of dtype by integer dot products on target (a name,
    or this process's)."""
    return dtype == "int8" and process_target(target).decode_int8_dot


def tolerance(dtype, default, *targets_used):
    """default, or INT16_DOT_MAX_NORMALIZED when any of targets_used (names; none: this
    process's target) reads a cache of dtype by integer dot products."""
    used = targets_used or (None,)
    return max(default, INT16_DOT_MAX_NORMALIZED) if any(int16_dot(dtype, t) for t in used) else default
