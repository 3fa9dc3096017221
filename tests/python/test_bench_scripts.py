"""The bench's scripts that measure nothing themselves:

- bench/ab_compare.py pairs two builds' sneppx-bench CSVs round by round: its
  speedups are per-round ratios (median, min, max), and CSVs that do not pair
  are refused, naming what is wrong;
- bench/plot.py draws each implementation once: the flash rows the attention stage
  records again as the baseline of its mask rows are no line of their own;
- bench/tp.sh alternates its two sides (A B, B A, ...) and gives their ratio as the
  median [min-max] of the per-round ratios;
- bench/torch_layer.py serves the layer stage's requests one line each: `run T`
  runs one forward at T (its inputs made once per T, outside the timed call),
  `ping` answers at once, anything else is an error line, `quit` ends it;
- bench/baselines/decode_serve.py serves the generate stage's requests for a
  decode baseline: `context C B` fills a cache, `step` runs one step on it (and
  none before a cache is made, or after one failed), errors are lines; a
  baseline without torch or llama_cpp says so and exits;
- bench/host_survey.sh refuses bad arguments before it builds or runs anything, and
  names the host its files are of from /proc/cpuinfo: a Xeon "xeon", another Intel
  core by its vendor, family and model; without an lscpu that lists caches it says
  so and goes on.
"""
import csv
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AB_COMPARE = REPO / "bench" / "ab_compare.py"
PLOT = REPO / "bench" / "plot.py"
HOST_SURVEY = REPO / "bench" / "host_survey.sh"
TP = REPO / "bench" / "tp.sh"
FIELDS = ["stage", "case", "impl", "tokens", "threads", "median_ms", "min_ms", "max_ms", "reps", "unit", "value",
          "value_min", "value_max", "peak", "fraction_of_peak", "baseline", "speedup"]


def write_csv(path, rows):
    """rows: (stage, case, impl, tokens, threads, median_ms)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        for stage, case, impl, tokens, threads, ms in rows:
            writer.writerow({"stage": stage, "case": case, "impl": impl, "tokens": tokens, "threads": threads,
                             "median_ms": ms, "min_ms": ms, "max_ms": ms, "reps": 3, "unit": "GFLOP/s"})
    return str(path)


def ab_compare(*args):
    return subprocess.run([sys.executable, str(AB_COMPARE), "--stage", "attention", "--impl", "flash", *args],
                          capture_output=True, text=True)


def test_speedups_are_ratios_within_rounds(tmp_path):
    # B's speedup per round: 10/8, 12/12, 9/6 -> median 1.25, min 1.0, max 1.5. A ratio of the
    # medians (10 / 8) would give the same 1.25: the range is what shows the rounds were paired.
    a_ms, b_ms = [10.0, 12.0, 9.0], [8.0, 12.0, 6.0]
    a, b = [], []
    for r, (x, y) in enumerate(zip(a_ms, b_ms)):
        other = ("attention", "causal d128 g4", "sdpa", 512, 2, 100.0)  # another impl: not compared
        a.append(write_csv(tmp_path / f"a{r}.csv", [("attention", "causal d128 g4", "flash", 2048, 2, x), other]))
        b.append(write_csv(tmp_path / f"b{r}.csv", [("attention", "causal d128 g4", "flash", 2048, 2, y), other]))
    result = ab_compare("old", ",".join(a), "new", ",".join(b))
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("  causal")]
    assert len(rows) == 1, result.stdout
    fields = rows[0].split()
    assert fields[3:5] == ["2048", "2"]
    assert float(fields[5]) == pytest.approx(10.0) and float(fields[6]) == pytest.approx(8.0)
    assert re.fullmatch(r"1\.250x", fields[7]) and fields[8] == "[1.000-1.500]", rows[0]


def test_rounds_must_pair(tmp_path):
    a = write_csv(tmp_path / "a.csv", [("attention", "c", "flash", 1, 1, 1.0)])
    result = ab_compare("old", f"{a},{a}", "new", a)
    assert result.returncode != 0
    assert "2 CSVs for old but 1 for new" in result.stderr


def test_no_common_rows_is_an_error(tmp_path):
    a = write_csv(tmp_path / "a.csv", [("attention", "c", "flash", 1, 1, 1.0)])
    b = write_csv(tmp_path / "b.csv", [("attention", "c", "flash", 2, 1, 1.0)])  # another T
    result = ab_compare("old", a, "new", b)
    assert result.returncode != 0
    assert "no 'attention' rows of 'flash' in every CSV" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--only", "full,bogus"], "--only: unknown step 'bogus'"),
    (["--rounds", "0"], "--rounds wants 1 to 99, not '0'"),
    (["--rounds", "x"], "--rounds wants 1 to 99, not 'x'"),
    (["--frobnicate"], "unknown argument '--frobnicate'"),
])
def test_host_survey_refuses_bad_arguments(args, message, tmp_path):
    # Refused before anything is built: nothing appears in --out.
    out = tmp_path / "results"
    result = subprocess.run(["bash", str(HOST_SURVEY), "--out", str(out), *args], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert not out.exists()


def cpuinfo(vendor, family, model, name, flags="fpu sse avx2"):
    return (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: {name}\nflags\t\t: {flags}\n\n")


@pytest.mark.parametrize("info, host", [
    (cpuinfo("AuthenticAMD", 25, 17, "AMD EPYC", "avx2 avx512f"), "zen4 (AuthenticAMD family 25 model 17, avx512)"),
    (cpuinfo("AuthenticAMD", 25, 1, "AMD EPYC 7763 64-Core Processor"), "zen3 (AuthenticAMD family 25 model 1, avx2)"),
    (cpuinfo("AuthenticAMD", 26, 2, "AMD EPYC", "avx512f"), "zen5 (AuthenticAMD family 26 model 2, avx512)"),
    (cpuinfo("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "avx512f"),
     "xeon (GenuineIntel family 6 model 143, avx512)"),
    # A client core is no Xeon: named by vendor, family and model, not filed with the Xeon's results.
    (cpuinfo("GenuineIntel", 6, 183, "13th Gen Intel(R) Core(TM) i9-13900K"),
     "GenuineIntel-6-183 (GenuineIntel family 6 model 183, avx2)"),
], ids=["zen4", "zen3", "zen5", "xeon", "intel-client"])
def test_host_survey_names_the_host(info, host, tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(info)
    out = tmp_path / "results"
    result = subprocess.run(["bash", str(HOST_SURVEY), "--out", str(out), "--print-host"], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "SNEPPX_CPUINFO": str(path)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(host + ", "), result.stdout
    assert not out.exists()


@pytest.mark.parametrize("lscpu", ["#!/bin/sh\necho 'lscpu: invalid option -- C' >&2\nexit 1\n", None],
                         ids=["lscpu-without-C", "no-lscpu"])
def test_host_survey_runs_without_lscpu_caches(lscpu, tmp_path):
    # An older lscpu (no -C) or none: the caches are "unknown", and the survey goes on.
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo("AuthenticAMD", 25, 33, "AMD Ryzen 9 5950X 16-Core Processor"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "lscpu"
    # A failing lscpu ahead of the real one, or a PATH without lscpu (the commands the script needs, linked).
    if lscpu:
        fake.write_text(lscpu)
        fake.chmod(0o755)
        search = f"{bin_dir}:{os.environ['PATH']}"
    else:
        for tool in ("awk", "grep", "tr", "nproc", "dirname"):
            (bin_dir / tool).symlink_to(shutil.which(tool))
        search = str(bin_dir)
    result = subprocess.run([shutil.which("bash"), str(HOST_SURVEY), "--print-host"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "SNEPPX_CPUINFO": str(path), "PATH": search})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("zen3 (AuthenticAMD family 25 model 33, avx2), "), result.stdout
    assert result.stdout.rstrip().endswith("caches unknown"), result.stdout


def test_plot_draws_no_line_for_a_baseline_copy(tmp_path):
    spec = importlib.util.spec_from_file_location("plot", PLOT)
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    rows = []
    for impl, case, baseline in [("flash", "causal d128 g4", "sdpa"), ("sdpa", "causal d128 g4", ""),
                                 ("flash", "explicit d128 g4", "causal"), ("causal", "causal d128 g4", ""),
                                 ("flash", "causal d128 g4 w4096", "no-win"), ("no-win", "causal d128 g4", "")]:
        rows.append({"stage": "attention", "case": case, "impl": impl, "tokens": "2048", "threads": "2",
                     "unit": "GFLOP/s", "value": "100", "value_min": "90", "value_max": "110",
                     "baseline": baseline})
    panels = plot.panels_of(rows)
    lines = {title: sorted(labels) for (_, title), labels in panels.items()}
    assert lines == {"attention causal d128 g4": ["flash 2t", "sdpa 2t"], "attention explicit d128 g4": ["flash 2t"]}


FAKE_RUN = """#!/bin/bash
# sneppx-run for tp.sh's test: the next time of its side's list, and the side in the log.
side=single; [[ " $* " == *" --tp "* ]] && side=ranks
count_file="$FAKE_DIR/$side.count"
n=$(( $(cat "$count_file" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$count_file"
read -ra times <<< "$( [[ $side == single ]] && echo "$FAKE_SINGLE" || echo "$FAKE_RANKS" )"
ms="${times[$(( (n - 1) % ${#times[@]} ))]}"
echo "$side" >> "$FAKE_DIR/order"
decode=0; [[ " $* " == *" --decode "* ]] && decode=1
if [[ $side == single ]]; then
    if ((decode)); then echo "   decode: median $ms ms per step (min 1, max 2) over 64 steps"
    else echo "   forward: first 1.00 ms, median $ms ms (min 1, max 2) over 5 runs = 1.0 GFLOP/s"; fi
else
    if ((decode)); then echo "   decode: $ms ms per step (the slowest rank's median) = 1.0 tokens/s"
    else echo "   forward: $ms ms (the slowest rank's median over 5 runs) = 1.0 GFLOP/s"; fi
fi
"""

FAKE_MPIRUN = """#!/bin/bash
# mpirun for tp.sh's test: runs the program once, with its arguments.
while (($#)) && [[ "$1" != */sneppx-run ]]; do shift; done
exec "$@"
"""


def test_tp_alternates_and_takes_the_median_of_per_round_ratios(tmp_path):
    run = tmp_path / "build" / "runtime" / "sneppx-run"
    run.parent.mkdir(parents=True)
    run.write_text(FAKE_RUN)
    mpirun = tmp_path / "bin" / "mpirun"
    mpirun.parent.mkdir()
    mpirun.write_text(FAKE_MPIRUN)
    run.chmod(0o755)
    mpirun.chmod(0o755)
    # Per round 10/5, 20/40, 30/15: ratios 2, 0.5, 2, median 2 [0.5-2]; the ratio of the
    # medians (20 / 15 = 1.33) is not what a round measured.
    env = {**os.environ, "SNEPPX_BUILD_DIR": str(tmp_path / "build"), "FAKE_DIR": str(tmp_path),
           "PATH": f"{mpirun.parent}:{os.environ['PATH']}", "FAKE_SINGLE": "10 20 30", "FAKE_RANKS": "5 40 15"}
    result = subprocess.run(["bash", str(TP), "--rounds", "3"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("prefill T=512"))
    assert row.split()[2:7] == ["20.00", "15.00", "2.00x", "[0.50-2.00]", "8388608"], row
    order = (tmp_path / "order").read_text().split()
    assert order[:6] == ["single", "ranks", "ranks", "single", "single", "ranks"], order


class _FakeTorch:
    """What torch_layer.serve uses of torch: rand and Generator (numpy stands in)."""

    class Generator:
        def manual_seed(self, seed):
            return self

    @staticmethod
    def rand(*shape, generator=None):
        import numpy
        return numpy.zeros(shape)


class _FakeLayer:
    hidden = 8

    def __init__(self):
        self.forwards, self.inputs_made = [], []

    def model_inputs(self, tokens):
        self.inputs_made.append(tokens)
        return ("cos", "sin", "mask")

    def forward(self, x, cos, sin, mask):
        self.forwards.append((x.shape, cos, sin, mask))


def test_torch_layer_serves_one_forward_per_request():
    spec = importlib.util.spec_from_file_location("torch_layer", REPO / "bench" / "torch_layer.py")
    torch_layer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(torch_layer)
    layer, out = _FakeLayer(), io.StringIO()
    torch_layer.serve(layer, _FakeTorch, io.StringIO("ping\nrun 4\nrun 4\nrun 0\nrun x\nfly\nrun 2\nquit\nrun 4\n"),
                      out)
    replies = out.getvalue().splitlines()
    assert replies[0] == "pong"
    assert all(re.fullmatch(r"done \d+\.\d{6}", r) for r in (replies[1], replies[2], replies[6])), replies
    assert [r.split()[0] for r in replies[3:6]] == ["error"] * 3, replies
    assert len(replies) == 7, "nothing is answered after quit"
    assert [f[0] for f in layer.forwards] == [(1, 4, 8), (1, 4, 8), (1, 2, 8)]
    assert layer.inputs_made == [4, 2], "a T's inputs are made once, at its first request"


class _FakeSession:
    """decode_serve.serve's session: records what it is asked; a context of 13 fails."""

    def __init__(self):
        self.prepared, self.steps = [], 0

    def prepare(self, context, batch):
        if context == 13:
            raise RuntimeError("no room for 13")
        self.prepared.append((context, batch))

    def step(self):
        self.steps += 1
        return 0.25


def test_decode_baselines_serve_one_step_per_request():
    spec = importlib.util.spec_from_file_location("decode_serve", REPO / "bench" / "baselines" / "decode_serve.py")
    decode_serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decode_serve)
    session, out = _FakeSession(), io.StringIO()
    requests = "step\nping\ncontext 512 16\nstep\nstep\ncontext 0 1\ncontext x 1\ncontext 13 1\nstep\nfly\n" \
               "context 64 1\nstep\nquit\nstep\n"
    decode_serve.serve(session, io.StringIO(requests), out)
    replies = out.getvalue().splitlines()
    assert replies[0].startswith("error no context"), replies
    assert replies[1:5] == ["pong", "ready 512 16", "done 0.250000", "done 0.250000"], replies
    assert [r.split()[0] for r in replies[5:10]] == ["error"] * 5, replies
    assert replies[7] == "error RuntimeError: no room for 13", "a failed cache says why"
    assert replies[8].startswith("error no context"), "and no step runs on the cache it replaced"
    assert replies[10:] == ["ready 64 1", "done 0.250000"], "nothing is answered after quit"
    assert session.prepared == [(512, 16), (64, 1)] and session.steps == 3


@pytest.mark.parametrize("script", ["decode_torch.py", "decode_llama_cpp.py"])
def test_decode_baselines_say_what_they_lack(script):
    shape = ["--hidden", "64", "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--rope-theta", "10000",
             "--threads", "1"]
    path = REPO / "bench" / "baselines" / script
    result = subprocess.run([sys.executable, str(path), *shape[:-2]], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--threads" in result.stderr, result.stderr
    # The system Python has neither torch nor llama_cpp: the server gets as far as the import.
    result = subprocess.run([sys.executable, str(path), *shape], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("unavailable "), result.stdout + result.stderr
