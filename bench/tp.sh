#!/usr/bin/env bash
# Tensor parallelism on this machine: llama3-8B's layer split by heads over 2 MPI
# ranks of 1 thread each (sneppx-run --tp under mpirun), against the same layer in
# one process of 2 threads, side by side, alternating (A B, B A, ...), each case several
# times: prefill T = 512 and 2048, decode steps at contexts 512 and 4096. Prints each
# side's median, the ratio (one process's time / the ranks') as the median [min-max]
# of its per-round values, as sneppx-bench's rounds do, and the bytes the ranks
# all-reduce (the [tokens, hidden] float32 output: 4 x hidden bytes per token and
# layer). Results in bench/results/tp.txt.
#   bench/tp.sh [--rounds N]       (default 3 rounds; needs a build with MPI: build/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
run="${SNEPPX_BUILD_DIR:-$root/build}/runtime/sneppx-run"
rounds=3
[[ "${1:-}" == "--rounds" ]] && rounds="$2"
[[ -x "$run" ]] || { echo "bench/tp.sh: no $run: build first (scripts/test.sh)" >&2; exit 1; }
mpirun_flags=(--oversubscribe --bind-to none -x OMP_NUM_THREADS=1)
[[ "$(id -u)" -eq 0 ]] && mpirun_flags+=(--allow-run-as-root)
arch=llama3-8B
hidden=4096

# The median of "forward:" / "decode:" lines (ms) of each run of a case.
single_ms() { "$run" --arch "$arch" --threads 2 "$@" 2>/dev/null |
    sed -n 's/.*forward: first [0-9.]* ms, median \([0-9.]*\) ms.*/\1/p; s/.*decode: median \([0-9.]*\) ms per step.*/\1/p'; }
ranks_ms() { mpirun -np 2 "${mpirun_flags[@]}" "$run" --arch "$arch" --tp --threads 1 "$@" 2>/dev/null |
    sed -n 's/.*forward: \([0-9.]*\) ms (the slowest.*/\1/p; s/.*decode: \([0-9.]*\) ms per step (the slowest.*/\1/p'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# "median [min-max]" of the values on stdin, one per line.
spread() { sort -g | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
                                              printf "%.2fx [%.2f-%.2f]", m, v[1], v[NR] }'; }

echo "bench/tp.sh: $arch, 1 process x 2 threads against 2 MPI ranks x 1 thread, $rounds rounds, $(date -u +%FT%TZ)"
echo "cpu: $(sed -n 's/^model name\t*: //p' /proc/cpuinfo | head -1), $(nproc) cores; load average at start: $(cut -d' ' -f1 /proc/loadavg)"
printf '%-26s %12s %12s %20s %22s\n' case "1 x 2 ms" "2 x 1 ms" "ratio [min-max]" "all-reduced per layer"
for spec in "prefill T=512:--seq 512 --repeat 5:512" "prefill T=2048:--seq 2048 --repeat 3:2048" \
            "decode b1 ctx 512:--context 512 --decode 64:1" "decode b1 ctx 4096:--context 4096 --decode 64:1"; do
    IFS=: read -r name args tokens <<< "$spec"
    single=() ranks=() ratios=()
    for ((r = 0; r < rounds; r++)); do
        # Odd rounds run the ranks first, so that neither side always follows the other.
        # shellcheck disable=SC2086
        if ((r % 2)); then
            t="$(ranks_ms $args)" s="$(single_ms $args)"
        else
            s="$(single_ms $args)" t="$(ranks_ms $args)"
        fi
        single+=("$s") ranks+=("$t") ratios+=("$(awk -v s="$s" -v t="$t" 'BEGIN { print s / t }')")
    done
    s="$(printf '%s\n' "${single[@]}" | median)" t="$(printf '%s\n' "${ranks[@]}" | median)"
    printf '%-26s %12.2f %12.2f %20s %14d bytes\n' "$name" "$s" "$t" "$(printf '%s\n' "${ratios[@]}" | spread)" \
        $((4 * hidden * tokens))
done
echo "all-reduced per token and layer: $((4 * hidden)) bytes ($arch); a ring all-reduce sends 2 (N-1)/N of it per rank"
