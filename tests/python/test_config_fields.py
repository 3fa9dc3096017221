"""The config's one field list (gen/sneppx_gen/config_fields.py) against everything
made from it:

- include/sneppx/config.h, as the C compiler lays it out (clang's record layout
  dump): the same fields, in the same order, with the same types; and the
  Python ctypes structs at the same offsets and sizes. A field in the header
  but not the list (even in padding) or in the list but not the header fails
  here; the build's own check (config_fields.c) is shown to refuse the second;
- the built library: sneppx_config_init() gives the list's defaults, every
  preset the library holds equals gen's Arch of it, field for field, and
  round-trips through LLMConfig's constructor;
- LLMConfig: a keyword argument and an attribute for every field.
"""
import ctypes
import dataclasses
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import reference as ref
import sneppx
from sneppx import _hf
from sneppx import _structs as S
from sneppx._library import lib

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "gen"))
from sneppx_gen import archs, config_fields, tables  # noqa: E402

INCLUDE = REPO / "include"
# The build's rendered headers (sneppx/limits.h), which config.h includes.
GENERATED = Path(os.environ.get("SNEPPX_BINARY_DIR", REPO / "build")) / "generated"


def _clang() -> str:
    """The clang the build uses (ctest passes it), else clang-19."""
    found = os.environ.get("SNEPPX_CLANG") or shutil.which("clang-19") or "/usr/lib/llvm-19/bin/clang"
    if not Path(found).is_file():
        pytest.skip("no clang-19 to lay out include/sneppx/config.h")
    return found


_LINE = re.compile(r"^\s*(\d+) \|( +)(.*\S)\s*$")


def header_layout(include_dir: Path, header: str = "sneppx/config.h",
                  types: Tuple[str, ...] = ("sneppx_config",)) -> Dict[str, List[Tuple[int, str, str]]]:
    """struct name -> [(offset, C type, field)] of its direct fields, and "<struct>.sizeof",
    as clang lays out include_dir/<header> (the structs types need, and theirs)."""
    probe = f"#include \"{header}\"\n" + "".join(f"extern char probe_{i}[sizeof({t})];\n" for i, t in enumerate(types))
    result = subprocess.run([_clang(), "-x", "c", "-std=c11", f"-I{include_dir}", f"-I{GENERATED}", "-fsyntax-only",
                             "-Xclang", "-fdump-record-layouts", "-"], input=probe, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    layouts: Dict[str, list] = {}
    current = None
    for line in result.stdout.splitlines():
        match = _LINE.match(line)
        if match and len(match.group(2)) == 1:           # "0 | struct sneppx_config"
            current = layouts.setdefault(match.group(3).replace("struct ", ""), [])
        elif match and len(match.group(2)) == 3 and current is not None:   # a direct field
            c_type, name = match.group(3).rsplit(" ", 1)
            current.append((int(match.group(1)), c_type.replace("struct ", ""), name))
        elif "[sizeof=" in line and current is not None:
            current.append((int(re.search(r"sizeof=(\d+)", line).group(1)), "sizeof", ""))
            current = None
    return layouts


def _list_type(field: config_fields.Field) -> str:
    """The list's C type as clang prints it."""
    return field.c_type.name.replace("SNEPPX_NAME_MAX", str(config_fields.NAME_MAX))


def differences(fields: Tuple[config_fields.Field, ...], header: List[Tuple[int, str, str]]) -> List[str]:
    """What the header's struct and the list disagree on, in words."""
    placed, size = config_fields.layout(fields)
    want = [(offset, _list_type(f), f.name) for f, offset in placed] + [(size, "sizeof", "")]
    have_names = {name for _, kind, name in header if kind != "sizeof"}
    want_names = {f.name for f in fields}
    out = [f"{name}: in the header, not in config_fields.py" for name in sorted(have_names - want_names)]
    out += [f"{name}: in config_fields.py, not in the header" for name in sorted(want_names - have_names)]
    if not out and header != want:
        out.append(f"the header has {header}, config_fields.py says {want}")
    return out


@pytest.fixture(scope="module")
def layout():
    return header_layout(INCLUDE)


def test_header_declares_exactly_the_listed_fields(layout):
    assert differences(config_fields.ROPE_SCALING_FIELDS, layout["sneppx_rope_scaling"]) == []
    assert differences(config_fields.CONFIG_FIELDS, layout["sneppx_config"]) == []


def test_ctypes_structs_have_the_c_layout(layout):
    """Offsets and sizes of the rendered ctypes structs against the C compiler's."""
    for struct, name in ((S.Config, "sneppx_config"), (S.RopeScaling, "sneppx_rope_scaling")):
        c_fields = [(offset, field) for offset, kind, field in layout[name] if kind != "sizeof"]
        assert [(getattr(struct, field).offset, field) for _, field in c_fields] == c_fields
        assert [field for field, _ in struct._fields_] == [field for _, field in c_fields]
        assert ctypes.sizeof(struct) == layout[name][-1][0]
    for field in config_fields.CONFIG_FIELDS:
        assert getattr(S.Config, field.name).size == config_fields.type_size_align(field.c_type)[0], field.name


# The structs the package mirrors by hand (sneppx._structs, _kv_cache, _tensor_parallel), by C name.
def _hand_mirrors() -> Dict[str, type]:
    from sneppx import _kv_cache, _tensor_parallel
    return {"sneppx_weights": S.Weights, "sneppx_tensor_ref": S.TensorRef, "sneppx_typed_weights": S.TypedWeights,
            "sneppx_attn_tensor": S.AttnTensor, "sneppx_kv_cache_options": _kv_cache.KVCacheOptions,
            "sneppx_kv_cache_stats": _kv_cache.KVCacheStats, "sneppx_shard_transport": _tensor_parallel.ShardTransport,
            "sneppx_shard": _tensor_parallel.Shard, "sneppx_shard_info": _tensor_parallel.ShardInfo}


def test_hand_written_mirrors_have_the_c_layout():
    """The ctypes structs written by hand against the public headers as clang lays them out:
    the same fields in order, offsets and sizes (C writes a whole struct into the mirror's
    buffer), and the constants the package restates."""
    mirrors = _hand_mirrors()
    layouts = header_layout(INCLUDE, "sneppx/sneppx.h", tuple(mirrors))
    for name, struct in mirrors.items():
        c_fields = [(offset, field) for offset, kind, field in layouts[name] if kind != "sizeof"]
        assert [(getattr(struct, field).offset, field) for _, field in c_fields] == c_fields, name
        assert [field for field, _ in struct._fields_] == [field for _, field in c_fields], name
        assert ctypes.sizeof(struct) == layouts[name][-1][0], name
    macros = subprocess.run([_clang(), "-x", "c", "-std=c11", f"-I{INCLUDE}", f"-I{GENERATED}", "-E", "-dM", "-"],
                            input="#include \"sneppx/sneppx.h\"\n#include \"sneppx_abi.h\"\n", capture_output=True, text=True, timeout=120)
    assert macros.returncode == 0, macros.stderr
    defined = dict(re.findall(r"^#define (SNEPPX_\w+) (.+)$", macros.stdout, re.M))
    assert int(defined["SNEPPX_ATTN_TENSORS_MAX"]) == S.ATTN_TENSORS_MAX
    assert int(defined["SNEPPX_SYNTHETIC_SEED"].rstrip("ULul"), 0) == S.SYNTHETIC_SEED
    assert int(defined["SNEPPX_GEMM_INT8_GROUP"]) == ref.INT8_GROUP


def _edited_header(tmp_path: Path, old: str, new: str) -> Path:
    (tmp_path / "sneppx").mkdir(parents=True)
    for header in (INCLUDE / "sneppx").iterdir():
        shutil.copy(header, tmp_path / "sneppx" / header.name)
    path = tmp_path / "sneppx" / "config.h"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return tmp_path


def test_a_header_field_missing_from_the_list_is_found(tmp_path):
    # In the padding after rope_interleaved: no offset or size changes, the name does.
    include = _edited_header(tmp_path, "    double rope_theta;", "    int rope_extra;\n    double rope_theta;")
    found = differences(config_fields.CONFIG_FIELDS, header_layout(include)["sneppx_config"])
    assert found == ["rope_extra: in the header, not in config_fields.py"]


def test_a_listed_field_missing_from_the_header_is_found_and_fails_the_build(tmp_path, monkeypatch):
    extra = config_fields.Field("window_stride", config_fields.INT64, 0, "a field the header lacks")
    fields = config_fields.CONFIG_FIELDS + (extra,)
    assert differences(fields, header_layout(INCLUDE)["sneppx_config"]) == [
        "window_stride: in config_fields.py, not in the header"]
    # The build's check (config_fields.c, compiled into libsneppx) refuses it too.
    monkeypatch.setattr(config_fields, "CONFIG_FIELDS", fields)
    source = tmp_path / "config_fields.c"
    source.write_text(tables.config_fields_c())
    result = subprocess.run([_clang(), "-std=c11", "-Wall", "-Wextra", f"-I{INCLUDE}", f"-I{GENERATED}", f"-I{REPO / 'runtime'}",
                             "-fsyntax-only", str(source)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "no member named 'window_stride'" in result.stderr


def test_the_build_check_refuses_a_moved_or_retyped_field(tmp_path):
    source = tmp_path / "config_fields.c"
    source.write_text(tables.config_fields_c())       # the real list
    include = _edited_header(tmp_path / "h", "    int o_bias;", "    int64_t o_bias;")
    result = subprocess.run([_clang(), "-std=c11", "-Wall", "-Wextra", f"-I{include}", f"-I{GENERATED}", f"-I{REPO / 'runtime'}",
                             "-fsyntax-only", str(source)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    offset = {f.name: at for f, at in config_fields.layout(config_fields.CONFIG_FIELDS)[0]}["o_bias"]
    assert f"sneppx_config.o_bias: not int at offset {offset}" in result.stderr
    include = tmp_path / "h"
    shutil.copy(INCLUDE / "sneppx" / "config.h", include / "sneppx" / "config.h")
    result = subprocess.run([_clang(), "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{include}",
                             f"-I{GENERATED}", f"-I{REPO / 'runtime'}", "-fsyntax-only", str(source)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def _values(config) -> Dict[str, object]:
    """Every field of a ctypes config or a gen dataclass, flat (rope_scaling.<field>)."""
    out: Dict[str, object] = {}
    for f in config_fields.CONFIG_FIELDS:
        value = getattr(config, f.name)
        if f.c_type is config_fields.ROPE_SCALING:
            out.update({f"rope_scaling.{r.name}": getattr(value, r.name)
                        for r in config_fields.ROPE_SCALING_FIELDS})
        else:
            out[f.name] = value.decode() if isinstance(value, bytes) else value
    return out


def test_init_gives_the_listed_defaults():
    config = S.Config()
    ctypes.memset(ctypes.byref(config), 0x5A, ctypes.sizeof(config))
    lib.sneppx_config_init(ctypes.byref(config))
    assert _values(config) == _values(config_fields.defaults())


@pytest.mark.parametrize("name", [arch.name for arch in archs.load_presets()])
def test_every_preset_round_trips(name):
    """The library's preset (sneppx_config_from_name) is gen's Arch of archs.json, field for
    field; LLMConfig's constructor rebuilds it from constructor_kwargs."""
    config = S.Config()
    assert lib.sneppx_config_from_name(name.encode(), None, ctypes.byref(config)) == 0
    assert _values(config) == _values(archs.find_preset(name))
    cfg = sneppx.LLMConfig(**_hf.constructor_kwargs(config))
    rebuilt, want = _values(cfg._config), _values(config)
    if config.kv_lora_rank:
        # MLA rotates qk_rope_head_dim dims: the preset spells that out in rotary_dim, which
        # MLA configs do not read (the constructor leaves it 0).
        assert (rebuilt.pop("rotary_dim"), want.pop("rotary_dim"), cfg.rotary_dim) == (0, 64, 64)
    else:
        assert bytes(cfg._config) == bytes(config)
    assert rebuilt == want


def test_llmconfig_takes_and_shows_every_field():
    parameters = inspect.signature(sneppx.LLMConfig.__init__).parameters
    # rotary_dim is taken as HF's partial_rotary_factor.
    assert [f.name for f in S.CONFIG_FIELDS if f.name not in parameters] == ["rotary_dim"]
    cfg = sneppx.LLMConfig.from_name("deepseek-v2-lite")
    for field in S.CONFIG_FIELDS:
        assert hasattr(cfg, field.name), field.name
        if field.python == "flag":
            assert getattr(cfg, field.name) is bool(getattr(cfg._config, field.name)), field.name


def test_gen_dataclasses_are_the_list():
    names = [f.name for f in config_fields.CONFIG_FIELDS]
    assert [f.name for f in dataclasses.fields(archs.Arch) if f.name not in ("family", "size", "aliases")] == names
    assert [f.name for f in dataclasses.fields(archs.config_json.CConfig)] == names
    rope_names = [f.name for f in config_fields.ROPE_SCALING_FIELDS]
    assert [f.name for f in dataclasses.fields(archs.RopeScaling)] == rope_names


def test_the_source_package_takes_the_structs_of_its_librarys_build(tmp_path):
    """Run from the source tree (PYTHONPATH=python), the package has no rendered module beside
    it: it takes the one the build of its library rendered, or says what to do."""
    from sneppx import _locate
    package = Path(sneppx.__file__).resolve().parent
    rendered = Path(S._fields.__file__).resolve()
    if not (package / "_config_fields.py").is_file():
        assert rendered == _locate.library_path().resolve().parents[1] / "python" / "sneppx" / "_config_fields.py"
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libsneppx.so").write_bytes(b"")   # never loaded: the structs come first
    env = dict(os.environ, SNEPPX_LIBRARY=str(tmp_path / "lib" / "libsneppx.so"), PYTHONPATH=str(REPO / "python"))
    result = subprocess.run([sys.executable, "-c", "import sneppx"], capture_output=True, text=True, env=env,
                            timeout=60)
    assert result.returncode != 0
    assert (f"ImportError: sneppx: _config_fields.py, rendered by the build, is neither in {REPO / 'python' / 'sneppx'} "
            f"nor in {tmp_path / 'python' / 'sneppx'} (the build tree of {tmp_path / 'lib' / 'libsneppx.so'}): "
            "build sneppx") in result.stderr


def test_a_rope_type_added_to_the_header_alone_fails_the_build(tmp_path):
    """sneppx_rope_type and config_fields.ROPE_TYPES (which the readers, the RoPE
    code and the messages are rendered from) must list the same types."""
    source = tmp_path / "config_fields.c"
    source.write_text(tables.config_fields_c())
    include = _edited_header(tmp_path / "h", "    SNEPPX_ROPE_TYPE_COUNT",
                             f"    SNEPPX_ROPE_LONGROPE = {len(config_fields.ROPE_TYPES)},\n    SNEPPX_ROPE_TYPE_COUNT")
    result = subprocess.run([_clang(), "-std=c11", "-Wall", "-Wextra", f"-I{include}", f"-I{GENERATED}",
                             f"-I{REPO / 'runtime'}", "-fsyntax-only", str(source)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "sneppx_rope_type has exactly the types of config_fields.ROPE_TYPES" in result.stderr
