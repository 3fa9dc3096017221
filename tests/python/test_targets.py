"""The instruction-set target table (gen/sneppx_gen/targets.py) is the one source:

- the C runtime's table (as `sneppx-ir --list-targets` prints it: order, names,
  vector widths, required LLVM features, and the GEMM tiles gemm_mr / gemm_nr
  its callers take from struct sneppx_target, the GEMM's default kc / mc and
  their tuning candidates, decode_int8_dot, which sets test_attn_decode.c's
  tolerance) equals TARGETS, and the target
  libsneppx picks from LLVM's host features is the one /proc/cpuinfo's flags
  pick (avx512f -> v16);
- the templates take their tiles from the target they render for: a target
  with other tiles renders other code;
- a target whose tiles the templates cannot do is refused, naming the value;
- a target is known by its name: a second target of an existing vector width,
  with other tiles, gets its own JIT sources, bitcode entries, keys and tiles
  in the registry table, and its vendored layer (its tiles as literals) runs
  as the first target's does.
"""
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "gen"))
from sneppx_gen import aot, archs, build, kernels, render, tables, targets  # noqa: E402
from sneppx_gen.targets import TARGETS, Target  # noqa: E402


def _sneppx_ir() -> Path:
    binary_dir = os.environ.get("SNEPPX_BINARY_DIR")
    path = Path(binary_dir or REPO / "build") / "runtime" / "sneppx-ir"
    if not binary_dir and not path.exists():
        pytest.skip("no build: set SNEPPX_BINARY_DIR (ctest does)")
    return path


def _c_targets():
    """[(name, fields, is_host)] of `sneppx-ir --list-targets`."""
    out = subprocess.run([str(_sneppx_ir()), "--list-targets"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    rows = []
    for line in out.splitlines():
        words = line.split()
        fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        rows.append((words[0], fields, words[-1] == "host"))
    return rows


def _cpuinfo_flags():
    flags = targets.cpuinfo_flags()
    if not flags:
        pytest.skip("no x86 flags in /proc/cpuinfo")
    return flags


def test_c_table_is_targets():
    rows = _c_targets()
    assert [name for name, _, _ in rows] == [t.name for t in TARGETS]
    for (name, fields, _), t in zip(rows, TARGETS):
        assert int(fields["vector_width"]) == t.vector_width, name
        assert tuple(f for f in fields["features"].split(",") if f) == t.llvm_features, name
        assert int(fields["gemm_mr"]) == t.gemm_mr, name
        assert int(fields["gemm_nr"]) == t.gemm_nr, name
        assert (int(fields["gemm_kc"]), int(fields["gemm_mc"]), int(fields["gemm_int8_mc"])) == \
            (t.gemm_kc, t.gemm_mc, t.gemm_int8_mc), name
        assert tuple(map(int, fields["gemm_kc_candidates"].split(","))) == t.gemm_kc_candidates, name
        assert tuple(map(int, fields["gemm_mc_candidates"].split(","))) == t.gemm_mc_candidates, name
        assert int(fields["decode_int8_dot"]) == int(t.decode_int8_dot), name


def test_host_target_matches_cpuinfo():
    flags = _cpuinfo_flags()
    hosts = [name for name, _, is_host in _c_targets() if is_host]
    assert hosts == [targets.host_target(flags).name]
    assert hosts == ["v16" if "avx512f" in flags else "v8"]


def _render_with(target: Target, family: str) -> str:
    return render.render_kernel(family, target, "jit")


def test_templates_take_tiles_from_target():
    other = dataclasses.replace(TARGETS[0], gemm_mr=12, gemm_small_mr=2, gemm_kc=256, gemm_mc=36, gemm_int8_mc=72,
                                gemm_mc_candidates=(36, 72), gemm_decode_panels=2, gemm_decode_sums=8, flash_nj=4,
                                flash_ne=2, gemm_batch_rows=20, gemm_batch_kc=96, gemm_fetch_sparse=True)
    gemm = _render_with(other, "gemm")
    assert "sneppx_gemm_micro12(" in gemm and "sneppx_gemm_micro2(" in gemm
    # The cache blocking is the key's (spec_kc, spec_mc), in whole MR-row groups; a task of
    # at most gemm_batch_rows rows over float32 panels, and the one-row sweep, slice k by
    # gemm_batch_kc when the key's KC is longer.
    batch_slice = "(spec_weight_type == SNEPPX_GEMM_FLOAT32 && spec_kc > 96 ? 96 : spec_kc)"
    assert "float block[(spec_mc + 11) / 12 * 12 * spec_kc]" in gemm and "k0 += slice)" in gemm
    assert f"slice = args->row_end - args->row_begin <= 20 ? {batch_slice} : spec_kc;" in gemm
    assert f"const int64_t slice = {batch_slice};" in gemm
    assert "sneppx_gemm_decode2(" in gemm and "whole = kc - kc % 4;" in gemm
    # gemm_fetch_sparse: a microkernel asks for the next slice's lines where k & fetch_mask is 0.
    assert "if (!(k & fetch_mask)) {" in gemm and "share_mask[(spec_mc + 11) / 12]" in gemm
    # aot: the target's defaults as literals (int8: the taller block and the key's KC for
    # every task), or a tuned key's.
    values = dict(k=4096, n=6144, bias=0, weight_type=3)
    int8 = render.render_kernel("gemm", other, "aot", dict(values, **kernels.default_tiles("gemm", other, 3)))
    assert "float block[72 * 256]" in int8 and "const int64_t slice = 256;" in int8
    tuned = render.render_kernel("gemm", other, "aot", dict(values, weight_type=0, kc=512, mc=40))
    assert "float block[48 * 512]" in tuned and "block_rows = 40;" in tuned
    assert "slice = args->row_end - args->row_begin <= 20 ? 96 : 512;" in tuned
    short = render.render_kernel("gemm", dataclasses.replace(other, gemm_batch_kc=256), "aot",
                                 dict(values, weight_type=0, kc=128, mc=36))
    assert "const int64_t slice = 128;" in short and "k0 += slice)" in short and "fetch_mask" in short
    plain = render.render_kernel("gemm", dataclasses.replace(other, gemm_fetch_sparse=False), "aot",
                                 dict(values, weight_type=0, kc=256, mc=36))
    assert "fetch_mask" not in plain and "fetch_rate" in plain
    assert "sneppx_gemm_micro14(" not in gemm and "sneppx_gemm_decode4(" not in gemm
    flash = _render_with(other, "attn_flash")
    assert "_Static_assert(SNEPPX_ATTN_BLOCK_KV % 4 == 0," in flash
    assert "e += 2)" in flash and "k3 = " in flash and "k4 = " not in flash
    decode = _render_with(dataclasses.replace(TARGETS[0], decode_rows=2, decode_nj=8, decode_ne=8), "attn_decode")
    assert "_Static_assert(SNEPPX_ATTN_BLOCK_KV % 8 == 0" in decode
    assert "q1 = " in decode and "q2 = " not in decode and "k7 = " in decode and "k8 = " not in decode
    assert "sneppx_attn_decode_values8(" in decode and "sneppx_attn_decode_values4(" not in decode


def test_decode_sweep_fetches_narrow_and_int8_rows_ahead():
    """gemm_decode_fetch_bytes: the one-row sweep over narrow or int8 panels asks for the
    line that many bytes on from each row that starts a line, while it is in the panel;
    float32 sweeps, and every sweep of a target with 0, ask for none."""
    v8 = next(t for t in TARGETS if t.name == "v8")
    ahead = dataclasses.replace(v8, gemm_decode_fetch_bytes=1024)
    values = dict(k=4096, n=6144, bias=0, kc=512, mc=24)
    # bfloat16 (two bytes a column, 32 bytes a v8 row): every other row, 32 rows on.
    narrow = render.render_kernel("gemm", ahead, "aot", dict(values, weight_type=1))
    assert "const int64_t fetch_before = k - k0 - 32;" in narrow
    assert "if (i < fetch_before && !(i & 1)) {" in narrow
    assert "__builtin_prefetch(s3 + (i + 32) * 16);" in narrow
    # int8 (16 bytes a v8 row after the group's 64 bytes of scales): the scales' line at
    # the group's start, then every fourth row, while the line is inside the panel.
    int8 = render.render_kernel("gemm", ahead, "aot", dict(values, weight_type=3))
    assert "const int64_t fetch_before = panel_step - group_offset - 1024;" in int8
    assert "const int64_t fetch_rows = (fetch_before - 49) / 16;" in int8
    assert "if (0 < fetch_before) {" in int8 and "__builtin_prefetch(group0 + 1024);" in int8
    assert "if (i < fetch_rows && !(i & 3)) {" in int8 and "__builtin_prefetch(q1 + i * 16 + 1024);" in int8
    assert "(void)panel_step;" not in int8
    # float32 never; no type when the target asks for none.
    assert "fetch_before" not in render.render_kernel("gemm", ahead, "aot", dict(values, weight_type=0))
    off = dataclasses.replace(v8, gemm_decode_fetch_bytes=0)
    for weight_type in (1, 2, 3):
        assert "fetch_before" not in render.render_kernel("gemm", off, "aot", dict(values, weight_type=weight_type))
    # jit: one template for every type, float32's bound folding to no fetch.
    assert ("const int64_t fetch_before = spec_weight_type == SNEPPX_GEMM_FLOAT32 ? 0 : k - k0 - 32;"
            in _render_with(ahead, "gemm"))
    # v16's 32 columns: a bfloat16 row is a line, an int8 row half of one.
    v16 = dataclasses.replace(next(t for t in TARGETS if t.name == "v16"), gemm_decode_fetch_bytes=2048)
    values16 = dict(values, mc=56)
    narrow16 = render.render_kernel("gemm", v16, "aot", dict(values16, weight_type=2))
    assert "if (i < fetch_before) {" in narrow16 and "__builtin_prefetch(s0 + (i + 32) * 32);" in narrow16
    int8_16 = render.render_kernel("gemm", v16, "aot", dict(values16, weight_type=3))
    assert "if (64 < fetch_before) {" in int8_16 and "__builtin_prefetch(group3 + 2112);" in int8_16
    assert "if (i + 3 < fetch_rows && !((i + 3) & 1)) {" in int8_16


def test_registry_table_has_each_targets_tiles():
    """The runtime takes a target's GEMM tiles from its table entry; the ABI header
    decides nothing by vector width."""
    table = tables.kernel_table([])
    for index, t in enumerate(TARGETS):
        assert (f'    {{.name = "{t.name}", .vector_width = {t.vector_width}, .features = target_features_{index}, '
                f'.gemm_mr = {t.gemm_mr}, .gemm_nr = {t.gemm_nr},\n'
                f'     .gemm_kc = {t.gemm_kc}, .gemm_mc = {t.gemm_mc}, .gemm_int8_mc = {t.gemm_int8_mc},\n') in table
    assert "vector_width" not in render.render_abi()


@pytest.mark.parametrize("change, message", [
    (dict(gemm_nr=48), "gemm_nr 48 is not 2 vectors"),
    (dict(vector_width=32, gemm_nr=64), "vector_width 32 is not a power of two in [8, 16]"),
    (dict(gemm_mc=50), "gemm_mc 50 is not whole 14-row groups"),
    (dict(gemm_int8_mc=42), "gemm_int8_mc 42 is not whole 14-row groups of at least gemm_mc"),
    (dict(gemm_small_mr=14), "gemm_small_mr 14 is not in (0, gemm_mr)"),
    (dict(gemm_kc=384), "gemm_kc 384 / gemm_mc 56 are not among their candidates (128, 256, 512) / (14, 28, 56)"),
    (dict(gemm_kc_candidates=(256, 500, 512)), "gemm_kc_candidates (256, 500, 512) are not all multiples of 32"),
    (dict(gemm_mc_candidates=(56, 60)), "gemm_mc_candidates (56, 60) are not all whole 14-row groups"),
    (dict(gemm_kc_candidates=tuple(range(256, 2561, 256))), "gemm_kc_candidates / gemm_mc_candidates: 1 to 8"),
    (dict(gemm_kc_candidates=(512, 2048)), "the largest GEMM block, 1179648 bytes of stack, is over 1048576"),
    (dict(gemm_decode_sums=2), "gemm_decode_sums 2 is not a multiple of gemm_decode_panels"),
    (dict(gemm_decode_fetch_bytes=96), "gemm_decode_fetch_bytes 96 is not whole lines of 64 bytes"),
    (dict(gemm_decode_fetch_bytes=-64), "gemm_decode_fetch_bytes -64 is not whole lines of 64 bytes"),
    (dict(flash_ne=3), "flash_ne 3 does not divide the head dim step 16"),
    (dict(decode_nj=3), "decode_nj 3 does not divide the 64-key tile"),
    (dict(decode_rows=2), "decode_rows 2 x decode_nj 4 is not the vector width 16"),
    (dict(decode_ne=0), "decode_ne 0 is not at least 1"),
    (dict(decode_burst_lines=-1), "decode_burst_lines -1 is below 0"),
    (dict(decode_ne=3), "decode_ne 3 is not whole loads of packed bfloat16 (2 vectors a load)"),
    (dict(decode_ne=6, decode_packed=("bfloat16", "int8")), "decode_ne 6 is not whole loads of packed int8 (4 vectors a load)"),
    (dict(decode_packed=("float16",)), "decode_packed ('float16',): only ('bfloat16', 'int8') can be read packed"),
    (dict(decode_int8_dot=True), "decode_int8_dot is written for 8 lanes (two SSE2 pmaddwd halves) and replaces "
                                 "packed int8 reads"),
    (dict(llvm_features=("avx512f",)), "llvm_features ('avx512f',) are not all +name"),
])
def test_bad_target_refused(change, message):
    with pytest.raises(ValueError, match=re.escape("target v16: " + message)):
        dataclasses.replace(TARGETS[0], **change)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_gemm_row_lines_touch_every_line_of_a_row(target):
    """The GEMM's C fetches ask for a row's lines at gemm_row_lines: every line a row of
    gemm_nr floats covers, wherever in a line it starts, and no line past it."""
    line = target.line_floats
    for start in range(line):
        covered = {(start + i) // line for i in range(target.gemm_nr)}
        fetched = {(start + offset) // line for offset in target.gemm_row_lines}
        assert fetched == covered, f"a row starting {start} floats into a line"


def test_unknown_target_named():
    with pytest.raises(ValueError, match="target must be one of v16, v8, not 'v4'"):
        targets.target_named("v4")
    with pytest.raises(ValueError, match="vector width must be one of 16, 8, not 4"):
        targets.target_of_width(4)
    with pytest.raises(ValueError, match=r"--bitcode gemm:16:x.bc: target must be one of v16, v8, not '16'"):
        tables.parse_bitcode_spec("gemm:16:x.bc")


def test_table_takes_a_width_twice_but_a_name_once(monkeypatch):
    twin = dataclasses.replace(TARGETS[0], name="v16bf", gemm_mr=12, gemm_mc=36, gemm_int8_mc=72,
                               gemm_mc_candidates=(36, 72))
    monkeypatch.setattr(targets, "TARGETS", (TARGETS[0], twin, TARGETS[1]))
    targets._check_table()
    monkeypatch.setattr(targets, "TARGETS", (TARGETS[0], dataclasses.replace(twin, name="v16"), TARGETS[1]))
    with pytest.raises(ValueError, match=re.escape("TARGETS: names ['v16', 'v16', 'v8'] must be unique")):
        targets._check_table()


def test_vector_width_alias_takes_the_first_of_a_width(second_v16):
    assert targets.target_of_width(16).name == "v16"


# Tiles of the second v16 target, other than v16's in every value the templates take.
TWIN_TILES = dict(gemm_mr=12, gemm_small_mr=2, gemm_kc=256, gemm_mc=36, gemm_int8_mc=72, gemm_mc_candidates=(36, 72),
                  gemm_decode_panels=2, gemm_decode_sums=8, flash_nj=4, flash_ne=2)


@pytest.fixture
def second_v16(monkeypatch):
    """A hypothetical AVX-512 + BF16 target of vector width 16 with tiles of its own, put
    between v16 and v8 everywhere gen reads the target table."""
    twin = dataclasses.replace(TARGETS[0], name="v16bf", llvm_features=("+avx512f", "+avx512bf16"),
                               cpuinfo_flags=("avx512f", "avx512_bf16"), **TWIN_TILES)
    table = (TARGETS[0], twin, TARGETS[1])
    names = tuple(t.name for t in table)
    for module in (targets, tables, render):
        monkeypatch.setattr(module, "TARGETS", table)
    monkeypatch.setattr(targets, "TARGET_NAMES", names)
    monkeypatch.setattr(build, "TARGET_NAMES", names)
    targets._check_table()
    return twin


def test_second_target_of_a_width_has_its_own_sources_and_keys(second_v16, tmp_path, capsys):
    assert build.main(["targets"]) == 0
    assert capsys.readouterr().out == "v16;v16bf;v8\n"
    for name in ("v16", "v16bf"):
        assert build.main(["jit-source", "--family", "gemm", "--target", name, "-o", str(tmp_path / f"gemm.{name}.c")]) == 0
    twin_source = (tmp_path / "gemm.v16bf.c").read_text()
    assert "sneppx kernel family gemm, vector width 16" in twin_source
    assert "sneppx_gemm_micro12(" in twin_source and "sneppx_gemm_micro14(" not in twin_source
    assert "sneppx_gemm_micro14(" in (tmp_path / "gemm.v16.c").read_text()

    values = {"k": 4096, "n": 6144, "bias": 0, "weight_type": 0}
    assert kernels.kernel_key("gemm", dict(values, **kernels.default_tiles("gemm", second_v16)), second_v16) == \
        "gemm-k4096-n6144-bias0-float32-kc256-mc36-v16bf"
    v16 = targets.target_named("v16")
    assert kernels.kernel_key("gemm", dict(values, **kernels.default_tiles("gemm", v16)), v16) == \
        "gemm-k4096-n6144-bias0-float32-kc512-mc56-v16"
    plan = aot.plan(archs.find_preset("llama3-8B"), second_v16, True)
    assert plan.unique_kernels() and all(k.key.endswith("-v16bf") for k in plan.unique_kernels())
    assert aot.manifest(plan)["vector_width"] == 16

    (tmp_path / "a.bc").write_bytes(b"A")
    (tmp_path / "b.bc").write_bytes(b"B")
    table = tables.kernel_table([tables.parse_bitcode_spec(f"gemm:{name}:{tmp_path / f}")[:2] + (data,)
                                 for name, f, data in (("v16", "a.bc", b"A"), ("v16bf", "b.bc", b"B"))])
    assert ('    {.name = "v16", .vector_width = 16, .features = target_features_0, .gemm_mr = 14, .gemm_nr = 32,\n'
            in table)
    assert ('    {.name = "v16bf", .vector_width = 16, .features = target_features_1, .gemm_mr = 12, .gemm_nr = 32,\n'
            in table)
    assert 'static const char *const target_features_1[] = {"+avx512f", "+avx512bf16", NULL};' in table
    assert '{"gemm", &sneppx_targets[0], bitcode_gemm_v16, sizeof bitcode_gemm_v16,' in table
    assert '{"gemm", &sneppx_targets[1], bitcode_gemm_v16bf, sizeof bitcode_gemm_v16bf,' in table


@pytest.mark.parametrize("family", ["mistral", "deepseek-v2"])
def test_same_width_targets_with_other_tiles_both_run(second_v16, family, tmp_path, rng):
    """The vendored layers of v16 and of its twin (other GEMM and flash tiles): each has
    its own target's tiles as literals, and both match the float64 reference and each
    other (standard attention with a window and GQA; MLA, whose packed layout has
    a panel count per matrix)."""
    from families import FAMILIES, make_inputs
    from test_aot import PAIR_MAX_NORMALIZED, PAIR_RMS_RELATIVE, AotLayer, _assert_close
    import reference as ref
    import sneppx

    hf_config = FAMILIES[family]
    config_file = tmp_path / f"{family}.json"
    config_file.write_text(json.dumps(dict(hf_config, name=family)))
    arch = archs.load_config_file(str(config_file))
    jit = sneppx.LLMConfig(**hf_config)
    weights = ref.random_state_dict(hf_config, rng, qkv_bias=jit.qkv_bias, o_bias=jit.o_bias)
    x, mask, positions = make_inputs("explicit", 2, 37, hf_config["hidden_size"], 0, rng)
    want = ref.mha_forward(hf_config, weights, x, mask, positions)
    outputs = {}
    for target in (targets.target_named("v16"), second_v16):
        out_dir = tmp_path / target.name
        aot.generate(arch, str(out_dir), target, True)
        source = next(out_dir.glob("sneppx_*.c")).read_text()
        prefix = re.search(r"#define (\w+)_GEMM_MR (\d+)\n", source)
        assert prefix and int(prefix.group(2)) == target.gemm_mr, f"{target.name}: no GEMM_MR {target.gemm_mr}"
        assert f"#define {prefix.group(1)}_GEMM_NR {target.gemm_nr}\n" in source
        assert f"_micro{target.gemm_mr}(" in source
        layer = AotLayer(out_dir)
        layer.load(weights)
        outputs[target.name] = layer.forward(x, mask, positions)
        _assert_close(outputs[target.name], want, f"{family} {target.name} vs reference", ref.FP32_MAX_NORMALIZED,
                      ref.FP32_RMS_RELATIVE)
    _assert_close(outputs["v16bf"], outputs["v16"].astype(np.float64), f"{family} v16bf vs v16", PAIR_MAX_NORMALIZED,
                  PAIR_RMS_RELATIVE)
