#!/usr/bin/env bash
# A/B of attn_decode between two checkouts, in one process (decode_ab.c): each
# checkout's sneppx-gen renders the kernel's key as C (what a vendored layer holds;
# the same template the JIT compiles), clang-19 -O2 builds both for this host, and
# decode_ab times them in alternated rounds, one core pinned.
#
#   bench/probes/decode_ab.sh A_CHECKOUT B_CHECKOUT [KV_TYPE ...]
#
# KV types default to float32 and int8; each runs from L2/L3 (512 keys, one copy)
# and from memory (4096 keys, copies past 256 MB). A/B above 1 means B is faster.
# CPU (the core to pin, default 1), ROUNDS (default 1000 from cache, 300 from memory)
# and CC (default clang-19) may be set in the environment.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
a="$(cd "$1" && pwd)"
b="$(cd "$2" && pwd)"
shift 2
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(float32 int8)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cc="${CC:-clang-19}"
cpu="${CPU:-1}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3=/usr/bin/python3
"$python3" "$b/gen/sneppx-gen" build abi -o "$work/sneppx_abi.h"
for type in "${types[@]}"; do
  for side in a b; do
    checkout="$a"
    [ $side = b ] && checkout="$b"
    src="$work/${side}_$type.c"
    "$python3" "$checkout/gen/sneppx-gen" build aot-source --family attn_decode --target v8 \
      --value head_dim=128 --value v_head_dim=128 --value group=4 --value window=0 \
      --value mask_mode=causal --value kv_type="$type" -o "$src"
    # The kernel's one external name becomes decode_a / decode_b.
    sed -i "s/^void sneppx_attn_decode_d128_dv128_g4_w0_causal_${type}_v8(/void decode_$side(/" "$src"
    grep -q "^void decode_$side(" "$src" || { echo "decode_ab.sh: no entry in $src" >&2; exit 1; }
    "$cc" -O2 -march=native -ffp-contract=fast -fno-math-errno -c "$src" -o "$work/${side}_$type.o"
  done
  "$cc" -O2 -march=native -I"$work" -I"$here/.." "$here/decode_ab.c" "$here/../timing.c" "$here/../page_table.c" \
    "$work/a_$type.o" "$work/b_$type.o" -lm -o "$work/decode_ab_$type"
  taskset -c "$cpu" "$work/decode_ab_$type" "$type" 512 1 "${ROUNDS:-1000}"
  taskset -c "$cpu" "$work/decode_ab_$type" "$type" 4096 0 "${ROUNDS:-300}"
done
