#!/bin/sh
# The emulated CPU is the one the tests mean: LLVM names it znver3, the runtime
# picks v8, and its features hold AVX2, FMA and F16C without AVX-512. The last
# part matters most: v8 also runs on a CPU without AVX2 (a QEMU before 7.2 drops
# it from EPYC-Milan), where the tests would pass while checking SSE code.
# Usage: check_host.sh QEMU CPU SNEPPX_CACHE SNEPPX_IR
set -eu
qemu=$1 cpu=$2 cache_tool=$3 ir_tool=$4
show=$("$qemu" -cpu "$cpu" "$cache_tool" show 2>/dev/null)
printf '%s\n' "$show" | grep "^host"
if ! printf '%s\n' "$show" | grep -q "cpu znver3, vector width 8"; then
  echo "check_host: want 'cpu znver3, vector width 8' on the emulated $cpu" >&2
  exit 1
fi
# The features LLVM compiles the kernels for, as a kernel's IR carries them.
features=$("$qemu" -cpu "$cpu" "$ir_tool" --family rmsnorm --value n=512 --stage specialized 2>/dev/null |
           sed -n 's/.*"target-features"="\([^"]*\)".*/\1/p' | head -n 1)
for feature in +avx2 +fma +f16c -avx512f; do
  case ",$features," in
    *",$feature,"*) echo "feature $feature" ;;
    *) echo "check_host: the emulated $cpu's features lack $feature: $features" >&2; exit 1 ;;
  esac
done
