"""The text sneppx-gen writes, read as a user reads a vendored file: no Jinja
artifacts (a line glued to the next by a whitespace-stripping tag, a literal
`{{`), over presets, both targets, the weight and KV dtypes and both attention
kernels; the header a source accepts, and the options its banner records. At most
a syntax check by the compiler: test_aot*.py build and run the files.
"""
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "gen"))
from sneppx_gen import aot, archs, render  # noqa: E402
from sneppx_gen.targets import target_named  # noqa: E402

# (preset, target, flash, weight dtype, compute dtype, KV dtype): every template of the
# layer file (standard and MLA pipelines, narrow caches, bfloat16 compute, SDPA) at least once.
CASES = [
    ("llama2-7B", "v16", True, "float32", "float32", "float32"),
    ("mistral-7B", "v8", False, "float16", "float32", "int8"),
    ("llama3-8B", "v16", True, "bfloat16", "bfloat16", "bfloat16"),
    ("qwen2-0.5B", "v8", True, "int8", "float32", "float16"),
    ("deepseek-v2-lite", "v16", True, "float32", "float32", "int8"),
    ("deepseek-v2-236B", "v8", False, "bfloat16", "float32", "float32"),
]


def _render(preset, target, flash, weight_dtype, compute_dtype, kv_dtype):
    from dataclasses import replace
    from sneppx_gen import config_fields
    arch = replace(archs.find_preset(preset), weight_dtype=config_fields.DTYPES.index(weight_dtype),
                   compute_dtype=config_fields.DTYPES.index(compute_dtype))
    return aot.render_layer(aot.plan(arch, target_named(target), flash, kv_dtype))


def _glued_lines(text):
    """Lines where a tag's whitespace control ate the line break before them: a
    directive or declaration that runs on after a value or a closing brace."""
    bad = []
    for number, line in enumerate(text.split("\n"), 1):
        if re.match(r"#define \w+ \S+/\*", line) or re.match(r"\}[A-Za-z_/]", line):
            bad.append(f"{number}: {line[:80]}")
    return bad


def test_abi_lines_stand_alone():
    """The ABI header (the runtime's and every vendored file's) keeps each
    definition on its own line, its tables indented as its code is."""
    abi = render.render_abi()
    assert not _glued_lines(abi)
    assert re.search(r"^#define SNEPPX_ABI_VERSION \d+$", abi, re.M)
    tables = re.findall(r"^static const unsigned char sneppx_attn_flash_block_queries_\d+\[\d+\] = \{\n(.*)$", abi,
                        re.M)
    assert tables and all(row.startswith("    ") for row in tables), tables


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(str(part) for part in case))
def test_layer_text_has_no_template_artifacts(case):
    for text in _render(*case):
        assert not _glued_lines(text)
        assert "{{" not in text and "{%" not in text and "{#" not in text


# A test the key decided, left in the text: two literals compared (`if (1 == 1)`,
# `if (1 == SNEPPX_MASK_CAUSAL)`, `4096 > 0 && ...`, `= 4096 > 0 ? ...`); the ABI's
# _Static_asserts and the layer's size checks compare literals on purpose and are
# neither `if`s nor `&&` chains.
TAUTOLOGY = re.compile(r"(?:if \(|\(|\? |= )\(?(\d+) (?:==|>|!=) (?:\d+|SNEPPX_MASK_[A-Z]+)\b(?! %)(?:\)| &&| \?)")


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(str(part) for part in case))
def test_layer_text_has_no_decided_tests(case):
    """The branches a key decides are in the vendored text as their code alone
    (spec.j2's branch and given): no test of two literals is left for the compiler to
    fold."""
    for text in _render(*case):
        found = [line.strip() for line in text.split("\n") if TAUTOLOGY.search(line)]
        assert not found, found[:5]


@pytest.mark.parametrize("case", [case for case in CASES if case[5] == "int8"],
                         ids=lambda case: "-".join(str(part) for part in case))
def test_int8_decode_kernel_has_no_dead_value_check(case):
    """int8 cache values are finite, so a vendored int8 attn_decode kernel holds
    neither the non-finite value check nor the pass it guards (which rendered as
    `if (3 == 3) return 1;` above code that never ran); the jit source keeps both
    under its spec_kv_type test."""
    source, _ = _render(*case)
    decode = re.search(r"sneppx kernel (attn_decode-\S+-int8-v\d+)", source)
    assert decode, "no int8 attn_decode kernel"
    prefix = "sneppx_" + re.sub(r"\W", "_", decode.group(1))
    assert f"{prefix}_values_finite" not in source and f"{prefix}_values_hidden" not in source
    assert not re.search(r"if \((\d+) == \1\)\s*return", source)
    jit = render.render_kernel("attn_decode", target_named(case[1]), "jit")
    assert "sneppx_attn_decode_values_finite(vp, keys)" in jit


def test_source_refuses_another_runs_header(tmp_path):
    """A vendored source compiles only with the header of its own run: a header of the
    same name from another run (here bfloat16 caches for float16 ones, whose API is the
    same) is a compile error naming both files, not a header whose sizes and cache type
    the source does not have."""
    import shutil
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) on PATH")
    bf16 = _render("llama3-8B", "v8", True, "float32", "float32", "bfloat16")
    f16 = _render("llama3-8B", "v8", True, "float32", "float32", "float16")
    ids = [re.search(r"^#define SNEPPX_LLAMA3_8B_HEADER_ID (0x[0-9a-f]{8})$", header, re.M) for _, header in (bf16, f16)]
    assert all(ids) and ids[0].group(1) != ids[1].group(1)
    for source, header, refused in ((bf16[0], bf16[1], False), (bf16[0], f16[1], True)):
        (tmp_path / "sneppx_llama3_8b.c").write_text(source)
        (tmp_path / "sneppx_llama3_8b.h").write_text(header)
        run = subprocess.run([cc, "-std=c11", "-fsyntax-only", str(tmp_path / "sneppx_llama3_8b.c")],
                             capture_output=True, text=True)
        assert (run.returncode != 0) == refused, run.stderr
        if refused:
            assert "sneppx_llama3_8b.h is not the header generated with sneppx_llama3_8b.c" in run.stderr


def test_int8_gemm_names_do_not_shadow(tmp_path):
    """The int8 GEMM's one-row kernel named a panel's group pointer g0, like the loop's
    row index g0 around it (gcc -Wshadow); each name now holds one thing."""
    import shutil
    import subprocess
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler on PATH")
    source, header = _render("qwen2-0.5B", "v8", True, "int8", "float32", "float32")
    (tmp_path / "sneppx_qwen2_0_5b.c").write_text(source)
    (tmp_path / "sneppx_qwen2_0_5b.h").write_text(header)
    run = subprocess.run([cc, "-std=c11", "-fsyntax-only", "-Wshadow", str(tmp_path / "sneppx_qwen2_0_5b.c")],
                         capture_output=True, text=True)
    assert run.returncode == 0 and "shadow" not in run.stderr, run.stderr


@pytest.mark.parametrize("first", [
    ["--arch", "llama3-8B", "--vector-width", "8", "--weight-dtype", "bfloat16", "--compute-dtype", "bfloat16"],
    ["--arch", "deepseek-v2-lite", "--target", "v16", "--sdpa", "--kv-dtype", "int8"],
    ["--config", "CONFIG", "--target", "v8", "--weight-dtype", "int8", "--kv-dtype", "float16"],
], ids=["preset-defaults", "mla-sdpa-int8", "config"])
def test_banner_options_regenerate_the_files(first, tmp_path):
    """The source's banner names the sneppx-gen options that made it, every choice
    explicit, as the manifest's "options" does: run again, they give the same four
    files byte for byte (a config's path stands as CONFIG.json)."""
    import json
    import subprocess
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 128, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "rope_theta": 1e6, "name": "tiny-q"}))
    gen = [sys.executable, str(REPO / "gen" / "sneppx-gen")]
    first = [str(config) if part == "CONFIG" else part for part in first]
    subprocess.run(gen + first + ["-o", str(tmp_path / "a")], check=True, capture_output=True)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    source = (tmp_path / "a" / manifest["source"]).read_text()
    banner = re.search(r"^ \* Generated by: sneppx-gen (.*)$", source, re.M)
    assert banner and banner.group(1).split() == manifest["options"]
    again = [str(config) if part == "CONFIG.json" else part for part in manifest["options"]]
    subprocess.run(gen + again + ["-o", str(tmp_path / "b")], check=True, capture_output=True)
    for name in ("manifest.json", "manifest.txt", manifest["source"], manifest["header"]):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
