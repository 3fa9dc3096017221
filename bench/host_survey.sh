#!/usr/bin/env bash
# Measures a kind of host the results do not have yet, in one go, into
# bench/results/ (named after the host: zen3, zen4, zen5, xeon, else vendor-family-model):
#   full-HOST-ISA.txt          bench/run.sh, every stage beside its baselines
#   tuning-HOST-ISA.txt        sneppx-cache tune in a fresh cache, then the gemm stage
#                              with its record: tuned, untuned and OpenBLAS in rounds
#   long-blocks-HOST-ISA.txt   flash's long query blocks from 512 keys back (this tree)
#                              against 1024 (a copy with SNEPPX_ATTN_LONG_BLOCK_KEYS
#                              1024), the attention stage in alternated processes
# ISA is avx512 or avx2 for the host's own target; with --avx2-target an AVX-512 host
# also measures its AVX2 kernels (SNEPPX_TARGET=v8, the baselines on their AVX2 code
# too, all but llama.cpp, built for the host) as ISA avx2-target. About 45 minutes on
# a 2-core host (55 the first time: the baselines' venv), twice that with --avx2-target.
#   bench/host_survey.sh [--avx2-target] [--only full,tuning,long-blocks] [--rounds N]
#                        [--out DIR] [--quick] [--print-host]
# --quick runs every step at sneppx-bench --quick's sizes into a scratch directory
# (no timing meaning: it checks the steps). --print-host prints the host line every
# file starts with (its first word names the files) and stops. Nothing here reads the
# results back but ab_compare.py; the docs' tables are written from the files by hand.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SNEPPX_BUILD_DIR:-$root/build-bench}"
usage="usage: bench/host_survey.sh [--avx2-target] [--only full,tuning,long-blocks] [--rounds N] [--out DIR] [--quick] [--print-host]"
steps="full,tuning,long-blocks" rounds=3 out="" quick=() avx2_target=0 print_host=0
while (($#)); do
    case "$1" in
        --avx2-target) avx2_target=1 ;;
        --only) steps="${2:?$usage}"; shift ;;
        --rounds) rounds="${2:?$usage}"; shift ;;
        --out) out="${2:?$usage}"; shift ;;
        --quick) quick=(--quick) ;;
        --print-host) print_host=1 ;;
        -h|--help) echo "$usage"; exit 0 ;;
        *) echo "host_survey: unknown argument '$1'" >&2; echo "$usage" >&2; exit 2 ;;
    esac
    shift
done
for step in ${steps//,/ }; do
    case "$step" in
        full|tuning|long-blocks) ;;
        *) echo "host_survey: --only: unknown step '$step' (full, tuning, long-blocks)" >&2; exit 2 ;;
    esac
done
if ! [[ "$rounds" =~ ^[1-9][0-9]?$ ]]; then
    echo "host_survey: --rounds wants 1 to 99, not '$rounds'" >&2
    exit 2
fi
has_step() { [[ ",$steps," == *",$1,"* ]]; }

# The host's kind, from /proc/cpuinfo's first processor ($SNEPPX_CPUINFO: another
# file in its format, for the tests).
cpuinfo="${SNEPPX_CPUINFO:-/proc/cpuinfo}"
cpu_field() { awk -F': *' -v f="$1" '$1 ~ "^"f"[ \t]*$" {print $2; exit}' "$cpuinfo"; }
vendor="$(cpu_field vendor_id)" family="$(cpu_field "cpu family")" model="$(cpu_field model)"
case "$vendor:$family" in
    AuthenticAMD:25)  # Zen 3 and Zen 4 share family 19h; their models do not overlap
        if ((model < 0x10 || (model >= 0x20 && model < 0x60))); then host=zen3; else host=zen4; fi ;;
    AuthenticAMD:26) host=zen5 ;;
    *) host="" ;;
esac
# Intel's family 6 holds its client cores as well as its Xeons: only a Xeon is "xeon".
if [[ -z "$host" && "$vendor" == GenuineIntel && "$(cpu_field "model name")" == *Xeon* ]]; then host=xeon; fi
[[ -n "$host" ]] || host="$(echo "$vendor-$family-$model" | tr -c 'A-Za-z0-9-\n' '-')"
host_isa=avx2
grep -qw avx512f "$cpuinfo" && host_isa=avx512
# Per core (or per instance), as the docs quote them: "L1d 32K, L2 1M, L3 32M". An lscpu
# without -C (older util-linux) or none at all leaves "unknown": under pipefail its
# failure would otherwise end the script here, silently.
caches="$( (lscpu -C=NAME,ONE-SIZE 2>/dev/null || true) |
    awk 'NR > 1 && $1 != "L1i" {printf "%s%s %s", sep, $1, $2; sep = ", "}')"
host_line="$host ($vendor family $family model $model, $host_isa), $(nproc) cores, caches ${caches:-unknown}"
if ((print_host)); then
    echo "$host_line"
    exit 0
fi
if ((avx2_target)) && [[ "$host_isa" != avx512 ]]; then
    echo "host_survey: --avx2-target: this host's own target is AVX2 already" >&2
    exit 2
fi

scratch="$(mktemp -d /tmp/sneppx-survey.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
if ((${#quick[@]})); then
    out="${out:-$scratch/results}"
else
    out="${out:-$root/bench/results}"
fi
mkdir -p "$out"
echo "host_survey: $host_line; results in $out"

# One target's steps: SNEPPX_TARGET is "" (the host's) or v8.
survey_target() {
    local target="$1" isa="$2"
    local name="$host-$isa"
    if has_step full; then
        echo "host_survey: full run -> $out/full-$name.txt"
        {
            # The bench prints only the CPU's model name ("AMD EPYC" on these VMs): say which host.
            echo "# bench/run.sh, the $isa kernels, on $host_line"
            SNEPPX_TARGET="$target" "$root/bench/run.sh" "${quick[@]}"
        } 2>&1 | tee "$out/full-$name.txt"
    fi
    if has_step tuning; then
        # A record is fingerprinted by the build that tuned it: the bench build's tool tunes.
        local cache="$scratch/tune-cache-$isa"
        echo "host_survey: tuning in a fresh cache, then the gemm stage with it -> $out/tuning-$name.txt"
        cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
        cmake --build "$build" --target sneppx-cache sneppx-bench -j"$(nproc)" >/dev/null
        {
            echo "# sneppx-cache tune, then bench/run.sh --stages gemm with its record, the $isa kernels"
            echo "# on $host_line"
            SNEPPX_TARGET="$target" SNEPPX_CACHE_DIR="$cache" "$build/runtime/sneppx-cache" tune
            SNEPPX_TARGET="$target" SNEPPX_CACHE_DIR="$cache" SNEPPX_BENCH_VENV= \
                "$root/bench/run.sh" --stages gemm "${quick[@]}"
        } 2>&1 | tee "$out/tuning-$name.txt"
    fi
    if has_step long-blocks; then
        survey_long_blocks "$target" "$isa" "$out/long-blocks-$name.txt"
    fi
}

# The attention stage of this tree (long blocks from 512 keys back) and of a copy
# whose blocks lengthen from 1024, alternated in separate processes.
survey_long_blocks() {
    local target="$1" isa="$2" result="$3"
    local copy="$scratch/src-long-1024"
    if [[ ! -d "$copy" ]]; then
        echo "host_survey: building a copy with SNEPPX_ATTN_LONG_BLOCK_KEYS 1024 in $copy"
        mkdir -p "$copy"
        git -C "$root" ls-files -z --cached --others --exclude-standard |
            tar -C "$root" --null -T - -cf - | tar -C "$copy" -xf -
        local abi="$copy/templates/abi.h.j2"
        sed -i 's/^#define SNEPPX_ATTN_LONG_BLOCK_KEYS 512$/#define SNEPPX_ATTN_LONG_BLOCK_KEYS 1024/' "$abi"
        if ! grep -qx '#define SNEPPX_ATTN_LONG_BLOCK_KEYS 1024' "$abi"; then
            echo "host_survey: templates/abi.h.j2 no longer defines SNEPPX_ATTN_LONG_BLOCK_KEYS 512 on a line" \
                 "of its own: update this step" >&2
            return 1
        fi
    fi
    local a_csvs=() b_csvs=()
    for ((r = 1; r <= rounds; r++)); do
        # Each side first in every other round: a host that speeds up or slows down
        # through the runs then weighs on both (bench/ab_compare.py).
        local order="512 1024"
        if ((r % 2 == 0)); then order="1024 512"; fi
        for side in $order; do
            local tree="$root" dir="$build"
            if [[ "$side" == 1024 ]]; then tree="$copy" dir="$copy/build-bench"; fi
            local csv="$scratch/long-blocks-$isa-$side-$r.csv"
            echo "host_survey: long blocks from $side keys, round $r of $rounds"
            SNEPPX_TARGET="$target" SNEPPX_BUILD_DIR="$dir" SNEPPX_BENCH_VENV= SNEPPX_CACHE_DIR="$scratch/cache-$side" \
                "$tree/bench/run.sh" --stages attention --csv "$csv" "${quick[@]}" >"$scratch/long-blocks-$isa-$side-$r.txt"
            if [[ "$side" == 512 ]]; then a_csvs+=("$csv"); else b_csvs+=("$csv"); fi
        done
    done
    {
        echo "# flash attention with long query blocks from 512 keys back (as built) against 1024, the"
        echo "# $isa kernels: the attention stage in $rounds alternated pairs of processes, on $host_line"
        local IFS=,
        /usr/bin/python3 "$root/bench/ab_compare.py" --stage attention --impl flash \
            from-512 "${a_csvs[*]}" from-1024 "${b_csvs[*]}"
    } | tee "$result"
}

survey_target "" "$host_isa"
if ((avx2_target)); then
    survey_target v8 avx2-target
fi
echo "host_survey: done; results in $out"
