"""The runtime's modules have no cycles, and docs/ARCHITECTURE.md lists them as they are.

The table of "The runtime's modules" is read as the order of the modules, leaves first:
every file of runtime/ (its top directory: tools/ and mpi/ build on the public API) must
be in one row, and may include only runtime headers of its own row or of rows above it.
A row names files as `x.c`, `x.h` or `x.{h,c}` (a file and its header, where they exist)
or `x` (both).
"""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "runtime"
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _table_rows(text):
    """The first cells of the modules table, in order."""
    section = text.split("## The runtime's modules", 1)[1].split("\n## ", 1)[0]
    return [line.split(" | ", 1)[0] for line in section.splitlines() if line.startswith("| `")]


def _files_of(token):
    """The runtime files a token of the table names; [] for one outside runtime/'s top."""
    if "/" in token:
        return []
    stem, brace, ext = re.fullmatch(r"([\w.]*?)(\.\{h,c\})?(\.[ch])?", token).groups()
    if brace or not ext:
        names = [f"{stem}.h", f"{stem}.c"]
    else:
        names = [f"{stem}{ext}"] + ([f"{stem}.h"] if ext == ".c" else [])
    found = [name for name in names if (RUNTIME / name).is_file()]
    explicit = f"{stem}{ext}" if ext and not brace else None
    if not found or (explicit and explicit not in found):
        pytest.fail(f"docs/ARCHITECTURE.md's modules table names `{token}`, which runtime/ does not hold")
    return found


def module_rows(text):
    """{runtime file: its row's index}."""
    rows = {}
    for index, cell in enumerate(_table_rows(text)):
        for token in re.findall(r"`([^`]+)`", cell):
            for name in _files_of(token):
                if name in rows and rows[name] != index:
                    pytest.fail(f"runtime/{name} is in two rows of the modules table")
                rows[name] = index
    return rows


def layering_problems(rows, sources):
    """What breaks the order: files the table lacks, includes of a module below."""
    problems = []
    for name, text in sorted(sources.items()):
        if name not in rows:
            problems.append(f"runtime/{name} is in no row of docs/ARCHITECTURE.md's modules table")
            continue
        for header in _INCLUDE.findall(text):
            if header in sources and rows.get(header, -1) > rows[name]:
                problems.append(f"runtime/{name} includes {header}, of a module below its own")
    return problems


def _runtime_sources():
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(RUNTIME.glob("*.[ch]"))}


def test_every_runtime_file_includes_only_its_module_and_those_above():
    problems = layering_problems(module_rows(ARCHITECTURE.read_text(encoding="utf-8")), _runtime_sources())
    assert not problems, "\n".join(problems)


def test_the_check_finds_an_include_from_below_and_an_unlisted_file():
    # The runtime as it is, with the two kinds of mistake the test exists for.
    rows = module_rows(ARCHITECTURE.read_text(encoding="utf-8"))
    sources = _runtime_sources()
    sources["error.c"] += '\n#include "kernels.h"\n'
    sources["new_module.c"] = '#include "error.h"\n'
    assert layering_problems(rows, sources) == [
        "runtime/error.c includes kernels.h, of a module below its own",
        "runtime/new_module.c is in no row of docs/ARCHITECTURE.md's modules table",
    ]
