"""`sneppx-gen --config FILE` refuses exactly the config.json files the runtime refuses
(sneppx_config_from_json + sneppx_config_validate), with the runtime's message.

- The command line: each file below used to be accepted by sneppx-gen (and turned
  into a layer that computed NaN, ran plain RoPE, did not compile, or failed every
  forward) or crashed it; now it exits 1 with one line on stderr naming the file
  and the field, writes nothing, and never hangs (a FIFO) or prints a traceback.
- In process, a corpus of accepted and refused files: gen's reader
  (gen/sneppx_gen/config_json.py) and the library (LLMConfig.from_config_json)
  agree on accept / refuse, on the message, and on every field of an accepted config.
"""
import ctypes
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sneppx
from sneppx import _structs as S

REPO = Path(__file__).resolve().parents[2]
SNEPPX_GEN = REPO / "gen" / "sneppx-gen"
sys.path.insert(0, str(REPO / "gen"))
from sneppx_gen import config_json  # noqa: E402

BASE = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
        "model_type": "llama"}


def _text(**fields) -> str:
    return json.dumps(dict(BASE, **fields))


# name -> (file text, the field the message names)
REFUSED_BY_CLI = {
    "linear-factor-0": (_text(rope_scaling={"rope_type": "linear", "factor": 0}), "config.rope_scaling.factor: 0"),
    "rope-theta-negative": (_text(rope_theta=-5), "config.rope_theta: -5"),
    "llama3-factor-only": (_text(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
                           "rope_scaling.low_freq_factor: missing"),
    "rope-theta-1e400": (_text(rope_theta=1.0).replace("1.0", "1e400"), "rope_theta: expected a finite number"),
    "original-max-1e30": (_text(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 1e30}),
                          "rope_scaling.original_max_position_embeddings: expected an integer"),
    "max-positions-0": (_text(max_position_embeddings=0), "config.max_position_embeddings: 0 is outside"),
    "model-type-gpt2": (_text(model_type="gpt2"), "model_type: 'gpt2' is not supported"),
    "duplicate-key": (_text()[:-1] + ', "num_attention_heads": 8}', "num_attention_heads: appears 2 times"),
    "unknown-rope-key": (_text(rope_scaling={"rope_type": "linear", "factor": 2.0, "scale": 2.0}),
                         "rope_scaling.scale: unknown key"),
    # A finite double scale past float's range: the kernels' float scale would be inf (NaN out),
    # the vendored file's literal an overflow.
    "softmax-scale-past-float": (json.dumps({"model_type": "deepseek_v2", "hidden_size": 64, "num_attention_heads": 4,
                                             "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                                             "v_head_dim": 16, "rope_scaling": {"type": "yarn", "factor": 40.0,
                                                                                "mscale_all_dim": 1e30}}),
                                 "config.rope_scaling.mscale_all_dim: 1e+30 gives the softmax scale 2.40555e+58, "
                                 "not a finite float > 0"),
    "nested-100000": ('{"model_type": "llama", "x": ' + "[" * 100000 + "]" * 100000 + "}", "not valid JSON"),
}


def _run_gen(config: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SNEPPX_GEN), "--config", str(config), "-o", str(out)],
                          capture_output=True, text=True, timeout=60)


def _library_message(path: Path) -> str:
    with pytest.raises(Exception) as error:
        sneppx.LLMConfig.from_config_json(path)
    return str(error.value)


@pytest.mark.parametrize("name", list(REFUSED_BY_CLI))
def test_cli_refuses_what_the_runtime_refuses(name, tmp_path):
    text, field = REFUSED_BY_CLI[name]
    config = tmp_path / "config.json"
    config.write_text(text)
    result = _run_gen(config, tmp_path / "out")
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sneppx-gen: {config}: {field}"), result.stderr
    assert not (tmp_path / "out").exists()
    # The runtime says the same (its nesting message gives a byte offset instead).
    message = _library_message(config)
    if name == "nested-100000":
        assert message.startswith(f"{config}: not valid JSON")
    else:
        assert lines[0] == f"sneppx-gen: {message}"


def test_cli_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    result = _run_gen(fifo, tmp_path / "out")      # used to block in open() forever
    assert result.returncode == 1
    assert result.stderr == f"sneppx-gen: {fifo}: not a regular file\n"


def test_cli_does_not_open_fifos_in_the_output(tmp_path):
    """A FIFO where an output file goes: opening it to compare or to read a manifest blocked
    forever (the timeout fired). A FIFO manifest is not sneppx-gen's; a FIFO source is replaced."""
    config = tmp_path / "tiny.json"
    config.write_text(_text())
    (tmp_path / "manifest").mkdir()
    os.mkfifo(tmp_path / "manifest" / "manifest.json")
    result = _run_gen(config, tmp_path / "manifest")
    assert result.returncode == 1
    assert result.stderr == (f"sneppx-gen: tiny: {tmp_path}/manifest/manifest.json is not a manifest sneppx-gen "
                             "wrote: generate sneppx_tiny into a directory of its own (-o)\n")
    (tmp_path / "source").mkdir()
    os.mkfifo(tmp_path / "source" / "sneppx_tiny.h")
    result = _run_gen(config, tmp_path / "source")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "source" / "sneppx_tiny.h").is_file()


def test_cli_accepts_the_base_config(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(_text())
    result = _run_gen(config, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "manifest.json").exists()


# ---- strings from a config that reach generated code ------------------------------------------

# A name that ends the banner comment of the generated .c/.h and defines a function: it used
# to compile warning-free and run.
INJECTED = "*/\nint sneppx_injected(void) { return 42; }\n/*"
HAND = {key: value for key, value in BASE.items() if key != "model_type"}


@pytest.mark.parametrize("form", [HAND, BASE], ids=["hand", "hf"])
@pytest.mark.parametrize("name, message", [
    (INJECTED, "name: byte 0 (0x2a) is not one of A-Z a-z 0-9 . _ -"),
    ("tiny\u0000*/", "not valid JSON, or a NUL in a string (at byte"),   # was cut at the NUL
    ("caf\u00e9", "name: byte 3 (0xc3) is not one of"),
    ("x" * 100000, "name: 100000 bytes, more than 63"),
    (7, "name: expected a string, got 7"),
], ids=["comment-and-code", "nul", "non-ascii", "100k", "number"])
def test_cli_refuses_a_name_that_is_not_a_name(form, name, message, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(form, name=name)))
    result = _run_gen(config, tmp_path / "out")
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"sneppx-gen: {config}: {message}"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and len(result.stderr) < 300
    assert not (tmp_path / "out").exists()


def test_cli_names_files_after_a_valid_name_or_the_file(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(HAND, name="Meta-Llama-3.1-8B_v2")))
    assert _run_gen(config, tmp_path / "named").returncode == 0
    source = (tmp_path / "named" / "sneppx_meta_llama_3_1_8b_v2.c").read_text()
    assert source.startswith("/* sneppx vendored attention layer: Meta-Llama-3.1-8B_v2 (generated")
    # Without a name, the file's own name, made into one: no character it may not hold.
    unnamed = tmp_path / "my model \u00e9*.json"
    unnamed.write_text(json.dumps(HAND))
    assert _run_gen(unnamed, tmp_path / "unnamed").returncode == 0
    assert json.loads((tmp_path / "unnamed" / "manifest.json").read_text())["arch"] == "my_model___"
    assert (tmp_path / "unnamed" / "sneppx_my_model___.c").exists()


def test_renderer_refuses_config_strings_that_would_leave_a_comment():
    """Defense in depth: an Arch built without the readers' checks still cannot put a
    config string into generated code where it would end a comment."""
    from sneppx_gen import aot, archs, render
    from sneppx_gen.targets import target_named
    base = archs.find_preset("qwen2-0.5B")
    for field in ("name", "family", "size"):         # family and size name the preset in the banner's options
        with pytest.raises(ValueError, match="cannot stand in a C comment"):
            aot.render_layer(aot.plan(dataclasses.replace(base, **{field: INJECTED}), target_named("v8"), True))
    for text in ("a */ b", "a /* b", "a\nb", "a\u00e9", "a\x7f"):
        with pytest.raises(ValueError, match="cannot stand in a C comment"):
            render.c_comment(text)
    assert render.c_comment("qwen2-0.5B") == "qwen2-0.5B"


# ---- the command line's options -----------------------------------------------------------

@pytest.mark.parametrize("options, option", [
    (["--arch", "llama3-8B", "--arch", "mistral-7B", "-o", "{out}"], "--arch"),
    (["--arch", "llama3-8B", "-o", "{out}", "--output", "{out}2"], "-o/--output"),
    (["--config", "{config}", "--config", "{config}", "-o", "{out}"], "--config"),
    (["--arch", "llama3-8B", "--vector-width", "8", "--vector-width", "16", "-o", "{out}"], "--vector-width"),
    (["--arch", "llama3-8B", "--target", "v8", "--target", "v16", "-o", "{out}"], "--target"),
])
def test_cli_refuses_a_repeated_option(options, option, tmp_path):
    """argparse kept the last value: one of two outputs or architectures, without a word."""
    config = tmp_path / "config.json"
    config.write_text(_text())
    argv = [item.format(out=tmp_path / "out", config=config) for item in options]
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"sneppx-gen: error: {option} given twice (" in result.stderr and "give it once" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_cli_names_an_empty_path(tmp_path):
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--arch", "llama3-8B", "-o", ""], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.endswith("sneppx-gen: error: -o: an empty path; give a directory\n"), result.stderr
    # An empty --config read the working directory's config.json.
    (tmp_path / "config.json").write_text(_text())
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--config", "", "-o", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.endswith("sneppx-gen: error: --config: an empty path; give a config.json or its checkpoint "
                                  "directory\n"), result.stderr
    assert not (tmp_path / "out").exists()


def _output_in_a_file(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("")
    return tmp_path / "file"


def _output_under_a_file(tmp_path: Path) -> Path:
    return _output_in_a_file(tmp_path) / "out"


def _output_a_dangling_link(tmp_path: Path) -> Path:
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    return tmp_path / "link"


def _output_holding_a_directory_for_the_source(tmp_path: Path) -> Path:
    (tmp_path / "out" / "sneppx_tiny.c").mkdir(parents=True)
    return tmp_path / "out"


@pytest.mark.parametrize("make_output, reason", [
    (_output_in_a_file, "Not a directory"),          # was "FILE/manifest.json is not a manifest sneppx-gen wrote"
    (_output_under_a_file, "Not a directory"),
    (_output_a_dangling_link, "Not a directory"),    # was "[Errno 17] File exists: 'LINK'"
    (_output_holding_a_directory_for_the_source, "{out}/sneppx_tiny.c: Is a directory"),  # named a temporary file
], ids=["file", "under-file", "dangling-link", "source-is-a-directory"])
def test_cli_names_an_output_it_cannot_write(make_output, reason, tmp_path):
    config = tmp_path / "tiny.json"
    config.write_text(_text())
    out = make_output(tmp_path)
    result = _run_gen(config, out)
    assert result.returncode == 1, result
    assert result.stderr == f"sneppx-gen: tiny: -o {out}: {reason.format(out=out)}\n"


def test_build_names_an_output_it_cannot_write(tmp_path):
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "build", "model-types", "-o", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1       # was a traceback
    assert result.stderr == f"sneppx-gen build model-types: -o {tmp_path}: Is a directory\n"


def test_cli_clips_an_unknown_name():
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--arch", "x" * 100000, "-o", "/nonexistent/out"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("sneppx-gen: unknown architecture '" + "x" * 64 + "...'; valid names: llama2-7B")
    assert len(result.stderr) < 1000
    # Cut on a whole UTF-8 character, as the library cuts it.
    result = subprocess.run([sys.executable, str(SNEPPX_GEN), "--arch", "x" * 63 + "\u00e9tail", "-o", "/nonexistent"],
                            capture_output=True, text=True, timeout=60)
    assert result.stderr.startswith("sneppx-gen: unknown architecture '" + "x" * 63 + "...'; valid")


# ---- gen's reader against the library's, in process ----------------------------------------

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
DEEPSEEK = {"model_type": "deepseek_v2", "hidden_size": 64, "num_attention_heads": 4, "kv_lora_rank": 32,
            "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16, "q_lora_rank": 0,
            "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64,
                             "mscale": 0.707, "mscale_all_dim": 0.707}}


def _nested(depth: int) -> str:
    return _text()[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"


CORPUS = {
    "base": _text(),
    "nulls-are-absent": _text(num_key_value_heads=None, rope_scaling=None, head_dim=None),
    "defaults": json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}),
    "mistral-window": _text(model_type="mistral", sliding_window=8),
    "mistral-window-negative": _text(model_type="mistral", sliding_window=-1),
    "qwen2": _text(model_type="qwen2", use_sliding_window=False),
    "qwen2-windows": _text(model_type="qwen2", use_sliding_window=True),
    # Qwen2Config's rule: the layers from max_window_layers slide (none without a window).
    "qwen2-windows-no-layer": _text(model_type="qwen2", use_sliding_window=True, num_hidden_layers=4,
                                    max_window_layers=4),
    "qwen2-windows-last-layer": _text(model_type="qwen2", use_sliding_window=True, num_hidden_layers=4,
                                      max_window_layers=3),
    "qwen2-windows-null": _text(model_type="qwen2", use_sliding_window=True, sliding_window=None),
    "qwen2-windows-layer-types-full": _text(model_type="qwen2", use_sliding_window=True, num_hidden_layers=40,
                                            layer_types=["full_attention"] * 2),
    "qwen2-windows-layer-types-sliding": _text(model_type="qwen2", use_sliding_window=True,
                                               layer_types=["full_attention", "sliding_attention"]),
    "qwen2-windows-layer-types-number": _text(model_type="qwen2", use_sliding_window=True, layer_types=[1]),
    "qwen2-windows-layers-float": _text(model_type="qwen2", use_sliding_window=True, num_hidden_layers=2.5),
    "attention-bias": _text(attention_bias=True),
    "attention-bias-int": _text(attention_bias=1),
    "deepseek": json.dumps(DEEPSEEK),
    "deepseek-no-kv-lora": json.dumps({k: v for k, v in DEEPSEEK.items() if k != "kv_lora_rank"}),
    "deepseek-kv-lora-0": json.dumps(dict(DEEPSEEK, kv_lora_rank=0)),
    "deepseek-kv-lora-24": json.dumps(dict(DEEPSEEK, kv_lora_rank=24)),
    # Heads of 16 + 24 = 40 would pass head_dim's multiple; 32 + 24 latent rows do not.
    "deepseek-latent-56": json.dumps(dict(DEEPSEEK, qk_nope_head_dim=8, qk_rope_head_dim=24)),
    "deepseek-window": json.dumps(dict(DEEPSEEK, model_type="mistral", sliding_window=4)),
    "deepseek-mscale-huge": json.dumps(dict(DEEPSEEK, rope_scaling=dict(DEEPSEEK["rope_scaling"],
                                                                         mscale_all_dim=-1e30))),
    "theta-1": _text(rope_theta=1.0),
    "theta-1.5": _text(rope_theta=1.5),
    "theta-string": _text(rope_theta="10000"),
    "theta-bool": _text(rope_theta=True),
    "hidden-float": _text(hidden_size=64.5),
    "hidden-string": _text(hidden_size="64"),
    "hidden-2^53+2": _text(hidden_size=2 ** 53 + 2),
    "head-dim-huge-int": _text()[:-1] + ', "head_dim": 1' + "0" * 400 + "}",
    "heads-missing": json.dumps({"model_type": "llama", "hidden_size": 64}),
    "kv-heads-3": _text(num_key_value_heads=3),
    "kv-heads-0": _text(num_key_value_heads=0),
    "head-dim-18": _text(head_dim=18),
    "head-dim-272": _text(head_dim=272, hidden_size=64),
    "head-dim-odd-hidden": _text(hidden_size=72),
    "partial-0.5": _text(partial_rotary_factor=0.5),
    "partial-0": _text(partial_rotary_factor=0),
    "partial-1.5": _text(partial_rotary_factor=1.5),
    "partial-0.01": _text(partial_rotary_factor=0.01),
    "partial-0.5-linear": _text(partial_rotary_factor=0.5, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "partial-1-yarn": _text(partial_rotary_factor=1, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    "partial-text-dynamic": _text(partial_rotary_factor="half", rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "rope-array": _text(rope_scaling=[1]),
    "rope-type-alias": _text(rope_scaling={"type": "linear", "factor": 2.0}),
    "rope-type-disagree": _text(rope_scaling={"type": "linear", "rope_type": "dynamic", "factor": 2.0}),
    "rope-type-missing": _text(rope_scaling={"factor": 2.0}),
    "rope-type-number": _text(rope_scaling={"rope_type": 3, "factor": 2.0}),
    "rope-default": _text(rope_scaling={"rope_type": "default"}),
    "rope-longrope": _text(rope_scaling={"rope_type": "longrope", "factor": 2.0}),
    "rope-longrope-own-keys": _text(rope_scaling={"rope_type": "longrope", "long_factor": [2.0], "short_factor": [1.0]}),
    "rope-type-number-unknown-key": _text(rope_scaling={"rope_type": 3, "scale": 2.0}),
    "rope-type-missing-unknown-key": _text(rope_scaling={"scale": 2.0}),
    "dynamic": _text(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "linear-negative-original": _text(rope_scaling={"rope_type": "linear", "factor": 2.0,
                                                    "original_max_position_embeddings": -5}),
    "linear-factor-inf": _text(rope_scaling={"rope_type": "linear", "factor": 1.0}).replace("1.0", "1e999"),
    "llama3": _text(rope_scaling=LLAMA3),
    "llama3-low-above-high": _text(rope_scaling=dict(LLAMA3, low_freq_factor=5.0)),
    "llama3-negative-original": _text(rope_scaling=dict(LLAMA3, original_max_position_embeddings=-1)),
    "llama3-tiny-factor": _text(rope_scaling=dict(LLAMA3, factor=1e-320)),
    "yarn-defaults": _text(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    "yarn-truncate-false": _text(rope_scaling={"rope_type": "yarn", "factor": 4.0, "truncate": False}),
    "yarn-truncate-null": _text(rope_scaling={"rope_type": "yarn", "factor": 4.0, "truncate": None}),
    "yarn-truncate-true": _text(rope_scaling={"rope_type": "yarn", "factor": 4.0, "truncate": True}),
    "yarn-factor-huge": _text(rope_scaling={"rope_type": "yarn", "factor": 1e308}),
    # beta_fast 1e-308: YaRN's correction range divides by its log, inf - inf: a negative
    # NaN, which the runtime's message prints "-nan".
    "yarn-beta-fast-tiny": json.dumps(dict(DEEPSEEK, rope_scaling=dict(DEEPSEEK["rope_scaling"], beta_fast=1e-308))),
    "yarn-attention-factor": _text(rope_scaling={"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.5}),
    "yarn-mscale-zero-ratio": _text(rope_scaling={"rope_type": "yarn", "factor": 4.0, "mscale": 1.0,
                                                  "mscale_all_dim": -7.213475204444817}),
    # transformers 5 saves rope_theta, partial_rotary_factor and the scaling in rope_parameters.
    "rope-parameters": _text(rope_parameters=dict(LLAMA3, rope_theta=500000.0)),
    "rope-parameters-default": _text(rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    "rope-parameters-theta-outside": _text(rope_theta=1e6, rope_parameters={"rope_type": "linear", "factor": 2.0}),
    "rope-parameters-theta-both": _text(rope_theta=7.0, rope_parameters={"rope_type": "default", "rope_theta": 9.0}),
    "rope-parameters-theta-string": _text(rope_parameters={"rope_type": "default", "rope_theta": "1e6"}),
    "rope-parameters-beside-scaling": _text(rope_scaling={"rope_type": "linear", "factor": 2.0},
                                            rope_parameters={"rope_type": "default", "rope_theta": 9.0}),
    "rope-parameters-partial-linear": _text(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                             "partial_rotary_factor": 0.5}),
    "rope-parameters-partial-default": _text(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
    # transformers takes `rope_scaling or rope_parameters`, and a dict without a type as plain RoPE.
    "rope-scaling-empty": _text(rope_scaling={}),
    "rope-scaling-empty-beside-parameters": _text(rope_scaling={}, rope_parameters=dict(LLAMA3, rope_theta=5e5)),
    "rope-parameters-untyped": _text(rope_parameters={"rope_theta": 1e6, "partial_rotary_factor": 1.0}),
    "rope-parameters-empty": _text(rope_theta=1e6, rope_parameters={}),
    "rope-parameters-untyped-factor": _text(rope_parameters={"rope_theta": 1e6, "factor": 2.0}),
    "rope-scaling-untyped-truncate": _text(rope_scaling={"truncate": True}),
    # A null counts as absent, a null type too.
    "rope-scaling-type-null": _text(rope_scaling={"rope_type": None, "factor": None}),
    "rope-parameters-type-null": _text(rope_parameters={"rope_type": None, "rope_theta": 1e6}),
    "rope-parameters-per-layer": _text(rope_parameters={"full_attention": {"rope_type": "default"}}),
    "rope-parameters-array": _text(rope_parameters=[1]),
    "rope-parameters-longrope": _text(rope_parameters={"rope_type": "longrope", "short_factor": [1.0]}),
    "rope-parameters-yarn-truncate-false": _text(rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                  "truncate": False}),
    "rope-parameters-deepseek": json.dumps(dict({k: v for k, v in DEEPSEEK.items() if k != "rope_scaling"},
                                                rope_parameters=dict(DEEPSEEK["rope_scaling"], rope_theta=1e4))),
    "duplicate-in-rope": _text()[:-1] + ', "rope_scaling": {"rope_type": "linear", "factor": 2, "factor": 3}}',
    "duplicate-ignored-key": _text()[:-1] + ', "vocab_size": 1, "vocab_size": 2}',
    "nul-in-key": _text()[:-1] + ', "hidden_size\\u0000x": 64}',
    "nul-in-model-type": _text(model_type="llama\u0000x"),
    "model-type-null": _text(model_type=None),
    "model-type-long": _text(model_type="\u00e9" * 40),
    "model-type-cut-inside-a-character": _text(model_type="x" + "\u00e9" * 40),
    # Control characters echo as '?' (no line of their own, no terminal escape).
    "model-type-control": _text(model_type="llama\n\u001b[2J\u007f"),
    "rope-key-control": _text(rope_scaling={"rope_type": "linear", "factor": 2.0, "fac\rtor": 1}),
    "rope-type-control": _text(rope_scaling={"rope_type": "lin\u001bear", "factor": 2.0}),
    "string-control": _text(hidden_size="\u0007" * 40),
    "nan-literal": _text()[:-1] + ', "rope_theta": NaN}',
    "trailing-bytes": _text() + " x",
    "trailing-space": _text() + " \n",
    "top-level-array": "[" + _text() + "]",
    "empty": "",
    # cJSON's lexicon: numbers as strtod reads them, bytes <= 0x20 as whitespace, a BOM,
    # raw control characters in strings; half a surrogate pair is an error.
    "number-01": _text()[:-1] + ', "head_dim": 016}',
    "number-1.": _text()[:-1] + ', "rope_theta": 10000.}',
    "number-1.e4": _text()[:-1] + ', "rope_theta": 1.e4}',
    "number--.5": _text()[:-1] + ', "x": -.5}',
    "number-.5": _text()[:-1] + ', "x": .5}',
    "number-+1": _text()[:-1] + ', "x": +1}',
    "number-1e": _text()[:-1] + ', "x": 1e}',
    "number-minus": _text()[:-1] + ', "x": -}',
    "surrogate-pair": _text()[:-1] + ', "x": "\\ud83d\\ude00"}',
    "surrogate-high-alone": _text()[:-1] + ', "x": "\\ud83d"}',
    "surrogate-low-alone": _text()[:-1] + ', "x": "a\\ude00"}',
    "surrogate-high-then-other": _text()[:-1] + ', "x": "\\ud83d\\u0041"}',
    "escaped-backslash-u": _text()[:-1] + ', "x": "\\\\ud83d"}',
    # A \u without four hex digits: cJSON reads it as NUL ("llama\u00zz" was llama); JSON refuses it.
    "unicode-escape-short": _text()[:-1].replace('"llama"', '"llama\\u00zz"') + "}",
    "unicode-escape-in-key": _text()[:-1] + ', "rope_scaling": {"rope_type": "linear", "factor\\uXXXX": 3, '
                             '"factor": 2}}',
    "unicode-escape-at-end": _text()[:-1] + ', "x": "\\u12"}',
    "control-in-string": _text()[:-1] + ', "x": "a\tb\x01"}',
    "invalid-utf8": _text()[:-1].encode() + b', "x": "\xff\xfe"}',
    "control-before": "\x01\x0b " + _text(),
    "control-between": _text().replace(", ", ",\x1f", 1),
    "control-after": _text() + "\x01",
    "nul-after": _text() + "\x00",
    "bom": "\ufeff" + _text(),
    "nested-999": _nested(999),
    "nested-1000": _nested(999)[:-1] + "}",    # the object itself is level 1
    "nested-1001": _nested(1000),
}


def _library_config(path: Path):
    try:
        return sneppx.LLMConfig.from_config_json(path)._config, None
    except (sneppx.Error, ValueError, NotImplementedError, OSError) as error:
        return None, str(error)


def _fields(config: S.Config) -> dict:
    out = {name: getattr(config, name) for name, _ in S.Config._fields_ if name not in ("name", "rope_scaling")}
    out.update({f"rope_scaling.{name}": getattr(config.rope_scaling, name) for name, _ in S.RopeScaling._fields_})
    return out


@pytest.mark.parametrize("name", list(CORPUS))
def test_reader_agrees_with_the_runtime(name, tmp_path):
    path = tmp_path / "config.json"
    text = CORPUS[name]
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    want, want_error = _library_config(path)
    try:
        _, got = config_json.read_file(str(path))
        got_error = None
    except config_json.ConfigError as error:
        got, got_error = None, str(error)
    if want_error is not None:
        assert got_error is not None, f"the runtime refuses ({want_error}); gen accepts"
        assert not re.search(r"[\x00-\x1f\x7f]", want_error), f"a control character in {want_error!r}"
        if "not valid JSON" in want_error:     # the byte offsets are cJSON's and json's
            assert got_error.startswith(f"{path}: not valid JSON"), got_error
        else:
            assert got_error == want_error
        return
    assert got_error is None, f"the runtime accepts; gen refuses: {got_error}"
    assert config_json.describe_config(got) == _fields(want)


# Configs set field by field in the library's struct and in gen's ("rope_scaling.<key>": a
# field of rope_scaling): both validators refuse them with one message.
YARN = {"rope_scaling.type": 4, "rope_scaling.factor": 4.0}
BUILT_BY_HAND = {
    # MLA rotates qk_rope_head_dim dims: a rotary_dim was dropped without a word.
    "mla-rotary-dim": (dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                            rope_interleaved=1, rotary_dim=8),
                       "config.rotary_dim: 8, but MLA rotates the qk_rope_head_dim (16) dims of each head: leave it 0"),
    # YaRN's 0 is the default (or derived); below it transformers fails (a beta's log) or
    # scales cos/sin by a negative number, where sneppx took the default silently.
    "yarn-beta-fast-negative": (dict(YARN, **{"rope_scaling.beta_fast": -5.0}),
                                "config.rope_scaling.beta_fast: -5 must be >= 0 (0: YaRN's 32)"),
    "yarn-beta-slow-negative": (dict(YARN, **{"rope_scaling.beta_slow": -0.5}),
                                "config.rope_scaling.beta_slow: -0.5 must be >= 0 (0: YaRN's 1)"),
    # transformers divides by zero (d / (d - 2)) for dynamic RoPE over 2 rotated dims.
    "dynamic-rotary-dim-2": ({"rope_scaling.type": 2, "rope_scaling.factor": 2.0, "rotary_dim": 2},
                             "config.rope_scaling.type: dynamic scales the base by a power d / (d - 2) of the "
                             "rotary dim d, which 2 makes infinite"),
    "yarn-attention-factor-negative": (dict(YARN, **{"rope_scaling.attention_factor": -2.0}),
                                       "config.rope_scaling.attention_factor: -2 must be >= 0 "
                                       "(0: derived from factor and mscale)"),
}


@pytest.mark.parametrize("name", list(BUILT_BY_HAND))
def test_validators_agree_on_configs_built_by_hand(name):
    from sneppx._library import lib
    fields, message = BUILT_BY_HAND[name]
    library = S.Config()
    lib.sneppx_config_init(ctypes.byref(library))
    gen = config_json.CConfig()
    rope = {}
    for key, value in dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, **fields).items():
        if key.startswith("rope_scaling."):
            rope[key[len("rope_scaling."):]] = value
            setattr(library.rope_scaling, key[len("rope_scaling."):], value)
        else:
            setattr(library, key, value)
            setattr(gen, key, value)
    gen.rope_scaling = dataclasses.replace(gen.rope_scaling, **rope)   # a frozen dataclass
    assert lib.sneppx_config_validate(ctypes.byref(library)) != 0
    assert lib.sneppx_last_error().decode() == message
    with pytest.raises(config_json.ConfigError) as error:
        config_json.validate(gen)
    assert str(error.value) == message


def test_hand_form_is_read_with_the_same_rules(tmp_path):
    """A file without model_type is sneppx's hand form (LLMConfig's keywords): same checks."""
    path = tmp_path / "hand.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": -5}))
    with pytest.raises(config_json.ConfigError, match=r"hand\.json: config\.rope_theta: -5 must be"):
        config_json.read_file(str(path))
    path.write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 4, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                                "qk_rope_head_dim": 16, "v_head_dim": 16, "partial_rotary_factor": 0.5}))
    with pytest.raises(config_json.ConfigError, match=r"partial_rotary_factor: MLA \(kv_lora_rank > 0\) rotates"):
        config_json.read_file(str(path))
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "qkv_bias": 2}))
    with pytest.raises(config_json.ConfigError, match=r"qkv_bias: expected true or false \(or 0 / 1\), got 2"):
        config_json.read_file(str(path))
    # Flags as LLMConfig takes them: bools or 0 / 1.
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "qkv_bias": 1, "o_bias": 0,
                                "use_flash_attn": False}))
    _, config = config_json.read_file(str(path))
    want = sneppx.LLMConfig(hidden_size=64, num_attention_heads=4, qkv_bias=1, o_bias=0, use_flash_attn=False)
    assert config_json.describe_config(config) == _fields(want._config)
    # A key LLMConfig does not take is refused by name: ignored, a misspelled window would
    # give a layer without one.
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "sliding_windw": 16}))
    with pytest.raises(config_json.ConfigError, match=r"hand\.json: sliding_windw: unknown key \(a config "
                       r"without model_type is sneppx\.LLMConfig's keywords; known: name, hidden_size, "):
        config_json.read_file(str(path))
    # LLMConfig's aliases of the head counts count, and must agree with the names they alias.
    path.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(config_json.ConfigError, match=r"hand\.json: num_attention_heads \(or num_heads\): missing"):
        config_json.read_file(str(path))
    path.write_text(json.dumps({"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2}))
    _, config = config_json.read_file(str(path))
    want = sneppx.LLMConfig(hidden_size=64, num_heads=4, num_kv_heads=2)._config
    assert config_json.describe_config(config) == _fields(want)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    path.write_text(json.dumps({"hidden_size": 64, "num_heads": 4, "num_attention_heads": 8}))
    with pytest.raises(config_json.ConfigError, match=r"num_attention_heads: 8 and its alias num_heads 4 disagree"):
        config_json.read_file(str(path))
    with pytest.raises(TypeError, match=r"num_attention_heads=8 and its alias num_heads=4 disagree"):
        sneppx.LLMConfig(hidden_size=64, num_heads=4, num_attention_heads=8)
    # The run-time settings are checked by the runtime's rules, although the generated file
    # takes neither.
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "mla_naive": True}))
    with pytest.raises(config_json.ConfigError, match=r"config\.mla_naive: applies to MLA configs"):
        config_json.read_file(str(path))
    with pytest.raises(sneppx.InvalidArgumentError, match=r"config\.mla_naive: applies to MLA configs"):
        sneppx.LLMConfig(hidden_size=64, num_attention_heads=4, mla_naive=True)
    # MLA's fields without kv_lora_rank: a layer without MLA would ignore them.
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "v_head_dim": 32}))
    with pytest.raises(config_json.ConfigError, match=r"config\.v_head_dim: 32 applies to MLA configs"):
        config_json.read_file(str(path))
    with pytest.raises(sneppx.InvalidArgumentError, match=r"config\.v_head_dim: 32 applies to MLA configs"):
        sneppx.LLMConfig(hidden_size=64, num_attention_heads=4, v_head_dim=32)
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "num_threads": 2048}))
    with pytest.raises(config_json.ConfigError, match=r"config\.num_threads: 2048 is outside \[0, 1024\]"):
        config_json.read_file(str(path))
    # A preset's entry, informational keys and all, is a hand config.
    preset = json.loads((REPO / "gen" / "archs.json").read_text())["presets"][0]
    path.write_text(json.dumps(preset))
    _, config = config_json.read_file(str(path))
    assert config.hidden_size == preset["hidden_size"]
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "bias": False, "o_bias": True}))
    _, config = config_json.read_file(str(path))
    want = sneppx.LLMConfig(hidden_size=64, num_attention_heads=4, bias=False, o_bias=True)._config
    assert config_json.describe_config(config) == _fields(want)
    assert ctypes.sizeof(want) > 0
