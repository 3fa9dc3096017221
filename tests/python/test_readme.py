"""README.md's examples work as written, so they cannot drift from the code.

Each Python block runs as a script under this interpreter, with PYTHONPATH
and SNEPPX_LIBRARY set, as the README's command line sets them, to the package
and library these tests use. Its C blocks are examples/quickstart.c and
examples/generate.c verbatim, in that order; the ctests example_quickstart and
example_generate build and run those files against libsneppx, and the README's
own `cc` command line compiles quickstart.c against the source tree and the
build's rendered headers.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

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


@pytest.mark.parametrize("index, expected", [(0, "gemm-k4096-n6144-bias0-float32-kc"), (1, "cached tokens [14, 22]")])
def test_readme_python_example_runs(tmp_path, index, expected):
    script = tmp_path / "readme_example.py"
    script.write_text(python_blocks()[index])
    env = dict(os.environ, SNEPPX_LIBRARY=str(sneppx.library_path().resolve()))
    package_parent = str(Path(sneppx.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in [env.get("PYTHONPATH")] if p])
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                            env=env, timeout=600)
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
