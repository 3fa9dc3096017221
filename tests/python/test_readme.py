"""README.md's examples work as written, so they cannot drift from the code.

Each Python block runs as a script under this interpreter, with PYTHONPATH
and SNEPPX_LIBRARY set, as the README's command line sets them, to the package
and library these tests use. Its C blocks are examples/quickstart.c and
examples/generate.c verbatim, in that order; the ctests example_quickstart and
example_generate build and run those files against libsneppx, and the README's
own `cc` command line compiles quickstart.c against the source tree and the
build's rendered headers. docs/API.md's checkpoint example runs on a small
checkpoint at its path's name, and every `gen/sneppx-gen` line of both pages
runs and writes the files its comment names; MODELS.md's preset table
is the runtime's presets, value for value; SECURITY.md's environment table is
every variable libsneppx, the Python package, sneppx-gen and sneppx-bench read;
and the README's sneppx-run table names the options sneppx-run --help lists and
its parser takes, with the defaults it runs.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import sneppx

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
C_EXAMPLES = [ROOT / "examples" / "quickstart.c", ROOT / "examples" / "generate.c"]

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def code_blocks(text: str) -> Dict[str, List[str]]:
    """Fenced blocks by their language tag ("" for none)."""
    blocks: Dict[str, List[str]] = {}
    for match in FENCE.finditer(text):
        blocks.setdefault(match.group(1), []).append(match.group(2))
    return blocks


def test_code_blocks_finds_tagged_fences():
    text = "intro\n```python\nprint(1)\n```\nmid\n```c\nint x;\n```\n```\nplain\n```\n"
    assert code_blocks(text) == {"python": ["print(1)\n"], "c": ["int x;\n"], "": ["plain\n"]}


def python_blocks():
    return code_blocks(README.read_text()).get("python", [])


def test_readme_has_two_python_examples():
    assert len(python_blocks()) == 2, "README.md should hold two ```python blocks: the forward and generation"


def run_python(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    """script under this interpreter, with the package and library these tests use."""
    env = dict(os.environ, SNEPPX_LIBRARY=str(sneppx.library_path().resolve()))
    package_parent = str(Path(sneppx.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600)


@pytest.mark.parametrize("index, expected", [(0, "gemm-k4096-n6144-bias0-float32-kc"), (1, "cached tokens [14, 22]")])
def test_readme_python_example_runs(tmp_path, index, expected):
    script = tmp_path / "readme_example.py"
    script.write_text(python_blocks()[index])
    result = run_python(script, tmp_path)
    assert result.returncode == 0, f"README.md's Python example failed:\n{result.stdout}\n{result.stderr}"
    # The first prints the layer's kernel keys (llama3-8B's fused QKV projection is one of
    # them), the second the rows' cached lengths.
    assert expected in result.stdout, result.stdout


def test_readme_c_examples_are_the_example_files():
    blocks = code_blocks(README.read_text()).get("c", [])
    assert len(blocks) == len(C_EXAMPLES), f"README.md should hold {len(C_EXAMPLES)} ```c blocks"
    for block, path in zip(blocks, C_EXAMPLES):
        assert block == path.read_text(), \
            f"README.md's C example differs from examples/{path.name}: copy the file into the README"


def readme_cc_arguments() -> List[str]:
    """The README's `cc` command line (shell continuations joined), split as the shell would."""
    for block in code_blocks(README.read_text()).get("sh", []):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("cc "):
                return shlex.split(line.split(" #")[0])
    raise AssertionError("README.md has no `cc ...` line in a ```sh block")


def compile_only(arguments: List[str], build: Path) -> List[str]:
    """The compile of a cc command line (no link: an ASan build's library needs the sanitizer
    runtime in every program), with its build/ paths pointing at this build."""
    out, skip = [], False
    for argument in arguments:
        if skip or argument == "-o":
            skip = not skip
            continue
        if argument.startswith(("-L", "-l", "-Wl,")):
            continue
        out.append(argument.replace("-Ibuild/", f"-I{build}/"))
    return out + ["-fsyntax-only"]


def test_compile_only_drops_link_and_output():
    arguments = ["cc", "-Iinclude", "-Ibuild/generated", "a.c", "-Lbuild/runtime", "-Wl,-rpath,x", "-lsneppx",
                 "-o", "a"]
    assert compile_only(arguments, Path("/b")) == ["cc", "-Iinclude", "-I/b/generated", "a.c", "-fsyntax-only"]


def test_readme_cc_command_compiles_quickstart():
    build = Path(os.environ.get("SNEPPX_BINARY_DIR") or sneppx.library_path().resolve().parents[1])
    arguments = readme_cc_arguments()
    assert "examples/quickstart.c" in arguments, arguments
    # The compiler is no test subject: without the sanitizer runtime the sanitized build preloads.
    env = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
    result = subprocess.run(compile_only(arguments, build), capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=300)
    assert result.returncode == 0, f"README.md's cc command does not compile quickstart.c:\n{result.stderr}"


DELIMITER_ROW = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")


def table_shape_errors(text: str, name: str) -> List[str]:
    """Tables whose delimiter row has another number of cells than their header: Markdown
    then renders no table at all, only the rows' raw text."""
    def cells(row: str) -> int:
        return len(re.split(r"(?<!\\)\|", row.strip().strip("|")))
    lines = text.splitlines()
    return [f"{name}:{i + 1}: header has {cells(lines[i - 1])} cells, delimiter row {cells(line)}"
            for i, line in enumerate(lines) if i > 0 and DELIMITER_ROW.match(line)
            and cells(lines[i - 1]) != cells(line)]


def test_table_shape_errors_counts_cells():
    assert table_shape_errors("| a | b |\n|---|---|\n| 1 | 2 |\n", "t") == []
    assert table_shape_errors("| a | b |\n|---|---|---|\n", "t") == ["t:2: header has 2 cells, delimiter row 3"]


def test_markdown_tables_are_well_formed():
    documents = [README] + sorted((ROOT / "docs").glob("*.md"))
    errors = [error for path in documents
              for error in table_shape_errors(path.read_text(), str(path.relative_to(ROOT)))]
    assert errors == [], "\n".join(errors)


# ---- docs/API.md's examples and the sneppx-gen command lines of both pages ------------

API = ROOT / "docs" / "API.md"
CHECKPOINT = "/models/Meta-Llama-3-8B"


def api_checkpoint_example() -> str:
    """docs/API.md's example of loading one layer of a checkpoint (an untagged block)."""
    for block in code_blocks(API.read_text()).get("", []):
        if block.startswith("cfg = ") and "load_safetensors(" in block:
            return block
    raise AssertionError("docs/API.md has no block that starts `cfg = ` and calls load_safetensors")


def test_api_checkpoint_example_runs(tmp_path):
    """The example as written, on a checkpoint of its path's shape but small: a llama
    config.json and layer 0's attention tensors (and another layer's) in one file."""
    from test_safetensors import write_safetensors  # the tests' own safetensors writer
    block = api_checkpoint_example()
    assert CHECKPOINT in block, f"docs/API.md's checkpoint example no longer reads {CHECKPOINT}"
    checkpoint = tmp_path / Path(CHECKPOINT).name
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"model_type": "llama", "hidden_size": 128, "num_attention_heads": 4, '
                                            '"num_key_value_heads": 2, "rope_theta": 500000.0}')
    shapes = sneppx.LLMConfig.from_config_json(str(checkpoint)).tensor_shapes()
    rng = np.random.default_rng(0)
    write_safetensors(checkpoint / "model.safetensors",
                      {f"model.layers.{layer}.self_attn.{name}": ("BF16", rng.standard_normal(shape) / 16)
                       for layer in (0, 1) for name, shape in shapes.items()})
    script = tmp_path / "api_example.py"
    script.write_text("import numpy as np\nimport sneppx\n" + block.replace(CHECKPOINT, str(checkpoint)) +
                      "assert cfg.weights_source.startswith('safetensors(') and cfg.weights_source.endswith('layer=0)')\n"
                      "assert out.shape == out_sdpa.shape == (1, 16, cfg.hidden_size) and out.dtype == np.float32\n"
                      "assert np.allclose(out, out_sdpa, atol=1e-5)\nprint('api example ran')\n")
    result = run_python(script, tmp_path)
    assert result.returncode == 0, f"docs/API.md's checkpoint example failed:\n{result.stdout}\n{result.stderr}"
    assert "api example ran" in result.stdout


def gen_command_lines(path: Path) -> List[str]:
    """The `gen/sneppx-gen ...` lines of a page's sh blocks, each with its comment."""
    return [line for block in code_blocks(path.read_text()).get("sh", []) for line in block.splitlines()
            if line.startswith("gen/sneppx-gen ")]


def named_outputs(comment: str) -> List[str]:
    """The files a comment names: "out/sneppx_x.{c,h}, manifest.json" -> out/sneppx_x.c,
    out/sneppx_x.h, out/manifest.json."""
    files, directory = [], ""
    for word in re.findall(r"[\w./{},-]+\.(?:\{[\w,]+\}|\w+)", comment):
        directory = word.rsplit("/", 1)[0] + "/" if "/" in word else directory
        name = word if "/" in word else directory + word
        stem, braces = re.fullmatch(r"(.*?)(?:\{([\w,]+)\})?", name).groups()
        files += [stem + ext for ext in braces.split(",")] if braces else [stem]
    return files


def test_named_outputs_expands_braces():
    assert named_outputs(" out/sneppx_a_1.{c,h}, manifest.json, manifest.txt") == \
        ["out/sneppx_a_1.c", "out/sneppx_a_1.h", "out/manifest.json", "out/manifest.txt"]
    assert named_outputs(" a checkpoint directory: out/sneppx_q.{c,h}") == ["out/sneppx_q.c", "out/sneppx_q.h"]
    assert named_outputs(" the presets") == []


@pytest.mark.parametrize("page", [README, API], ids=["README", "API"])
def test_gen_command_lines_run(tmp_path, page):
    """Each `gen/sneppx-gen` line of the page's sh blocks runs as written, alone in a
    directory holding the config.json and checkpoint directory it names, and writes the
    files its comment names."""
    lines = gen_command_lines(page)
    assert len(lines) >= 3, f"{page.name} should show sneppx-gen's --list, --arch and --config"
    qwen2 = '{"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4}'
    for i, line in enumerate(lines):
        command, _, comment = line.partition("#")
        work = tmp_path / str(i)
        (work / "ckpt" / "Qwen2-7B").mkdir(parents=True)
        (work / "ckpt" / "Qwen2-7B" / "config.json").write_text(qwen2)
        (work / "config.json").write_text(qwen2)
        arguments = shlex.split(command)[1:]
        result = subprocess.run([sys.executable, str(ROOT / "gen" / "sneppx-gen"), *arguments], capture_output=True,
                                text=True, cwd=work, timeout=600)
        assert result.returncode == 0, f"{page.name}: `{line}` failed:\n{result.stderr}"
        missing = [name for name in named_outputs(comment) if not (work / name).is_file()]
        assert not missing, f"{page.name}: `{line}` wrote no {missing}"
        if "--list" in arguments:
            assert "mistral-7B" in result.stdout and "deepseek-v2-lite" in result.stdout, result.stdout


# ---- docs/MODELS.md's preset table against the presets ---------------------------------

MODELS = ROOT / "docs" / "MODELS.md"


def table_rows(section: str, columns: int, starts: str = "| ") -> List[List[str]]:
    """The stripped cells of every markdown table row in section that starts with `starts`
    and has `columns` cells (a separator row, "|---|", starts otherwise)."""
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith(starts) and len(cells) == columns:
            rows.append(cells)
    return rows


def models_preset_rows() -> Dict[str, List[str]]:
    """Section 1's table: {preset name: [its cells after the name]}; "(alias X)" is dropped
    from the name and kept as a last cell."""
    section = MODELS.read_text().split("## 1.", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for cells in table_rows(section, 10):
        if cells[0] == "preset":
            continue
        name, alias = re.fullmatch(r"(\S+)(?: \(alias (\S+)\))?", cells[0]).groups()
        rows[name] = cells[1:] + [alias or ""]
    return rows


def preset_cells(name: str) -> List[str]:
    """What MODELS.md's row of a preset says, from the runtime's own preset."""
    cfg = sneppx.LLMConfig.from_name(name)
    biases = [side for side, on in (("q, k, v", cfg.qkv_bias), ("o", cfg.o_bias)) if on]
    return [str(cfg.hidden_size), str(cfg.num_attention_heads),
            "MLA" if cfg.is_mla else str(cfg.num_key_value_heads),
            f"{cfg.head_dim} = {cfg.qk_nope_head_dim} + {cfg.qk_rope_head_dim}, v {cfg.v_head_dim}" if cfg.is_mla
            else str(cfg.head_dim),
            str(cfg.max_position_embeddings), f"{cfg.rope_theta:.0f}",
            cfg.rope_scaling["rope_type"] if cfg.rope_scaling else "–",
            str(cfg.sliding_window) if cfg.sliding_window else "–",
            ", ".join(biases) if biases else "none"]


def test_models_preset_table_is_the_presets():
    rows = models_preset_rows()
    assert sorted(rows) == sorted(sneppx.LLMConfig.names()), "docs/MODELS.md section 1 lists other presets"
    for name, cells in rows.items():
        assert cells[:-1] == preset_cells(name), f"docs/MODELS.md's row of {name}"
        if cells[-1]:
            assert sneppx.LLMConfig.from_name(cells[-1]).name == name, f"docs/MODELS.md: alias {cells[-1]}"


# ---- docs/SECURITY.md's environment variables against the code that reads them ---------

SECURITY = ROOT / "docs" / "SECURITY.md"
#: Where each reader's sources are, and how they read a variable: C's getenv() (and the
#: disk cache's read_env_number()), Python's os.environ or a module constant *_ENV.
ENV_READERS = {
    "libsneppx": (["runtime/*.c", "runtime/tools/*.c", "runtime/tools/*/*.c"],
                  r'\b(?:getenv|read_env_number)\(\s*"([A-Z_][A-Z0-9_]*)"'),
    "Python package": (["python/sneppx/*.py"],
                       r'environ(?:\.get\(|\[)\s*"([A-Z_][A-Z0-9_]*)"|\b[A-Z_]+_ENV\s*=\s*"([A-Z_][A-Z0-9_]*)"'),
    "sneppx-gen": (["gen/sneppx-gen", "gen/sneppx_gen/*.py"], r'environ(?:\.get\(|\[)\s*"([A-Z_][A-Z0-9_]*)"'),
    # Its own: the baselines' OPENBLAS_* environment is OpenBLAS's, which the bench sets.
    "sneppx-bench": (["bench/*.c"], r'\bgetenv\(\s*"(SNEPPX_[A-Z0-9_]*)"'),
}


def variables_read(sources: List[str], pattern: str) -> Dict[str, str]:
    """{variable: a file that reads it} over the sources' files."""
    found = {}
    for glob in sources:
        for path in sorted(ROOT.glob(glob)):
            for match in re.finditer(pattern, path.read_text()):
                found.setdefault(next(group for group in match.groups() if group), str(path.relative_to(ROOT)))
    return found


def test_variables_read_finds_each_form():
    c_pattern, python_pattern = ENV_READERS["libsneppx"][1], ENV_READERS["Python package"][1]
    assert re.findall(c_pattern, 'x = getenv("SNEPPX_A"); read_env_number("SNEPPX_B", "a size")') == \
        ["SNEPPX_A", "SNEPPX_B"]
    assert [m.group(1) or m.group(2) for m in re.finditer(python_pattern, 'os.environ.get("A_B")\n'
                                                          'LIBRARY_ENV = "C_D"\nos.environ["E"]')] == ["A_B", "C_D", "E"]


def documented_variables() -> Dict[str, str]:
    """SECURITY.md's environment table: {variable: its "read by" cell}."""
    section = SECURITY.read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for cells in table_rows(section, 3, "| `"):
        for name in re.findall(r"`([A-Z_][A-Z0-9_]*)`", cells[0]):
            rows[name] = cells[1]
    return rows


@pytest.mark.parametrize("reader", sorted(ENV_READERS))
def test_security_lists_every_environment_variable(reader):
    """Every variable a component reads is a row of SECURITY.md's table that names the
    component as a reader, and every row naming it is one it reads: a new variable (or one
    no longer read) cannot go unnoticed."""
    documented = documented_variables()
    assert "SNEPPX_CACHE_DIR" in documented and "SNEPPX_LIBRARY" in documented, "SECURITY.md's table moved"
    sources, pattern = ENV_READERS[reader]
    read = variables_read(sources, pattern)
    undocumented = {name: path for name, path in read.items() if reader not in documented.get(name, "")}
    assert not undocumented, f"docs/SECURITY.md's environment table lacks (as read by {reader}): {undocumented}"
    stale = [name for name, readers in documented.items() if reader in readers.split(", ") and name not in read]
    assert not stale, f"docs/SECURITY.md says {reader} reads {stale}, which its sources never read"


def test_sneppx_cache_help_names_documented_variables():
    build = Path(os.environ.get("SNEPPX_BINARY_DIR") or sneppx.library_path().resolve().parents[1])
    result = subprocess.run([str(build / "runtime" / "sneppx-cache"), "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    named = re.findall(r"\b(SNEPPX_[A-Z0-9_]+)\b", result.stdout.split("Environment:", 1)[1])
    libsneppx = variables_read(*ENV_READERS["libsneppx"])
    assert named and [name for name in named if name not in libsneppx or name not in documented_variables()] == []


# ---- README's sneppx-run option table against sneppx-run ------------------------------

def readme_run_options() -> Dict[str, List[str]]:
    """The README's sneppx-run table: {option: [its meaning, its default]} for every option
    its first cell names (`--seq T`, `--batch B` is two rows' worth)."""
    section = README.read_text().split("| option | meaning | default |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for cells in table_rows(section, 3, "| `"):
        for option in re.findall(r"`(--[a-z-]+)", cells[0]):
            rows[option] = cells[1:]
    return rows


def run_tool(name: str, *arguments: str) -> subprocess.CompletedProcess:
    build = Path(os.environ.get("SNEPPX_BINARY_DIR") or sneppx.library_path().resolve().parents[1])
    return subprocess.run([str(build / "runtime" / name), *arguments], capture_output=True, text=True, timeout=600)


def test_readme_run_options_are_sneppx_runs():
    """The README's table, sneppx-run --help and the options sneppx-run's parser compares
    its arguments with name the same options (--help and -h aside)."""
    documented = set(readme_run_options())
    assert {"--arch", "--seq", "--batch", "--decode", "--list-archs"} <= documented, "README's table moved"
    usage = run_tool("sneppx-run", "--help")
    assert usage.returncode == 0, usage.stderr
    in_help = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", usage.stdout)) - {"--help"}
    source = (ROOT / "runtime" / "tools" / "sneppx-run.c").read_text()
    parsed = set(re.findall(r'strcmp\(arg, "(--[a-z-]+)"\)', source)) - {"--help"}
    assert documented == parsed, f"README's sneppx-run table lists {sorted(documented - parsed)} that sneppx-run " \
                                 f"does not take, and lacks {sorted(parsed - documented)}"
    assert in_help == parsed, f"sneppx-run --help lists {sorted(in_help - parsed)} that it does not take, and " \
                              f"lacks {sorted(parsed - in_help)}"


def test_readme_run_defaults_are_sneppx_runs():
    """The table's defaults of --seq, --batch and --repeat are what sneppx-run runs without
    them, and its default presets (the prose's four) are what --help says it runs."""
    options = readme_run_options()
    assert options["--seq"][1] == options["--batch"][1] == "128, 1" and options["--repeat"][1] == "5"
    result = run_tool("sneppx-run", "--arch", "qwen2-0.5B", "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert re.search(r"== qwen2-0\.5B: .*, batch 1, seq 128, flash, float32 weights\n", result.stdout), result.stdout
    assert " over 5 runs " in result.stdout, result.stdout
    prose = " ".join(README.read_text().split("| option | meaning | default |", 1)[0].rsplit("For each of ", 1)[1]
                     .split())
    presets = re.findall(r"[\w.-]+", prose.split(", `sneppx-run` creates", 1)[0].replace(" and ", ", "))
    usage = " ".join(run_tool("sneppx-run", "--help").stdout.split())
    assert f"(default: {' '.join(presets)})" in usage, (presets, usage)
