"""The instruction-set targets kernels are built for, in order of preference.

One table: the templates take their register tiles from a kernel's target
(render.py passes it as `target`), the build makes JIT bitcode of every
family for every target (gen/CMakeLists.txt asks `sneppx-gen build
targets`), the C runtime's target table is rendered from it
(tables.py, into the kernel registry table) and libsneppx runs, on a host,
the first target whose LLVM features the host has (runtime/host.c).
The tiles a caller needs (gemm_mr for its GEMM tasks, gemm_nr for the packed
weights' size) travel with the target: the runtime reads them from its
table's struct sneppx_target, a vendored layer, rendered for one target,
has them as literals. A new target is one entry here plus whatever its
tiles need that the templates do not yet do (Target.__post_init__ refuses
what they cannot).

A target's name is its identity: the suffix of every key of its kernels
(`gemm-k4096-n6144-bias0-float32-kc512-mc56-v16`), of its JIT sources (`gemm.v16.c`) and what
the runtime finds its bitcode by. Its vector width is a property, which
several targets may share (an AVX-512 target with other tiles or features
beside v16).

Why each value:

- vector_width: floats per vector register, 16 (zmm) with AVX-512F, else 8
  (ymm). v8 requires nothing: it is the fallback, since LLVM legalizes 8-wide
  vectors on any x86-64 (two xmm without AVX), so every host runs something.
- llvm_features: what the host must have, in LLVM's names (the host list
  LLVMGetHostCPUFeatures gives, "+avx512f"); cpuinfo_flags: the same features
  as Linux's /proc/cpuinfo names them (sneppx-gen's default width; the names
  differ for some, e.g. LLVM's avx512bf16 is cpuinfo's avx512_bf16).
- gemm_mr: rows of the GEMM microkernel's register tile. It keeps an MR x NR
  tile of C in 2*MR vector registers, plus two for the W row and one
  broadcast: 14 rows use 31 of AVX-512's 32 zmm, 6 rows 15 of AVX2's 16 ymm.
  The runtime makes GEMM tasks of whole MR-row tiles (its target's gemm_mr).
- gemm_nr: columns of a packed weight panel and of the register tile: two
  vectors (the microkernel holds each row of C as a lo and a hi vector), so
  one broadcast activation feeds two FMAs per row and k.
- gemm_small_mr: the height of the second microkernel, which takes a task's
  last group when it has at most this many rows (T = 2..4, or T mod MR
  small): measured on one core, T = 128 ran 8% slower with MR-row padding
  alone than with a 4-row height.
- gemm_kc, gemm_mc: the k slice and the rows of the activation block that
  stays in L2 while every weight panel slice meets it. KC = 512 with MC = 4
  MR-row groups (56 rows, 112 KiB at v16) ran 2-7% faster at T = 128..2048
  than 256 x 8 groups (the same block: C is loaded and stored once per k
  slice, half as often); KC 128 and 1024 were slower. v8 keeps KC and the 4
  groups (a 48 KiB block). Both are the defaults: the GEMM key carries its
  KC and MC (`gemm-k4096-n6144-bias0-float32-kc512-mc56-v16`), which a host's
  tuning record may change (below).
- gemm_kc_candidates, gemm_mc_candidates: what `sneppx-cache tune` (or
  SNEPPX_TUNE=1 at first use) times on a host for float32 panels, each KC with
  each MC, and keeps the fastest in the disk cache (runtime/gemm_tuner.c); the
  defaults are among them. They bound the key's kc and mc (kernels.py): a
  kernel's block lives on its stack (MC x KC floats, plus a KC x NR widened
  int8 slice), so the largest stays under 1 MiB.
- gemm_int8_mc: the activation block's rows for int8 weights. Their panel
  slice is widened to float32 once per block (templates/gemm.c.j2), so a
  taller block widens less often: 8 groups (112 rows, 224 KiB at v16) took
  the int8 GEMM from 0.93x to 0.95x float32 on one Zen 5 core, where float32
  itself ran 2% slower with 112 rows than with 56 (its MC stays). v8 takes 16
  groups (96 rows, 192 KiB, well inside a 512 KiB L2): against 8 groups, one Zen
  4 core ran k 4096 x n 6144 and 4096 2.4-2.6% faster at T = 128, 512 and 2048
  (alternated rounds), two 1.7% at T = 2048.
- gemm_fetch_spread: how a block's groups fetch the next panel's slice (a KC x
  NR slice, 32 KiB at v8's KC 512, read from memory once per block and panel)
  into L2 while they consume this one. False: one group fetches all of it, a
  line per k row (the last group, or the first when the block has at most two).
  True: each group fetches a share in proportion to its microkernel's height, so
  that the lines are asked for at one pace through the whole block (G groups of
  one height: a k row of the next slice every G k rows each). One group asking
  for the whole slice in its 512 k rows asks for 32 GB/s, beyond a Zen 3 core's memory
  bandwidth, while the block's groups together consume it at a quarter of that
  rate; spread, the same lines arrive at the rate they are used. v8, Zen 3, the
  gemm stage (sneppx against OpenBLAS in rounds, OpenBLAS the control): T = 128
  1.13-1.16x OpenBLAS where one fetching group gave 1.06-1.10x (one thread 90-91%
  of peak, was 86-87%), T = 512 1.02-1.03x (0.98-1.02x), T = 2048 1.00x on one
  thread (0.98x). v16 the same: on the Intel Xeon (48 KiB L1d, 2 MiB L2 per
  core), gemm stages in alternated processes, one fetching group against spread:
  T = 128 1.15-1.21x, T = 512 1.07-1.12x, T = 2048 1.06-1.14x on one and two
  threads; against OpenBLAS (SkylakeX kernels, the same runs) T = 128 1.21-1.31x
  (was 1.03-1.14x), T = 512 0.98-1.04x (0.93-0.99x), T = 2048 0.92-0.97x
  (0.87-0.91x). Taller blocks did not help it there (MC 112: 0.87-1.01x of 56),
  and the tuner, timing KC x MC with spread, kept the defaults. Unmeasured on
  AMD's AVX-512 cores (Zen 4 and 5), where one fetching group ran 89-93% of peak.
  The shares were first powers of two (2^s groups for the largest 2^s not above
  the block's groups, a later group fetching the last share again), which left
  a block of 3 groups (16 rows at v8: 6, 6 and a 4-row kernel) fetching nothing
  through its last group and a block of 14 + 2 rows at v16 asking for half the
  slice in its short group: in proportion, the Intel Xeon's 16-row GEMM from
  memory (k 4096 x n 6144, two threads, alternated in one process) ran 1.07-1.08x
  faster at v8 and 30 rows 1.04x at v16; 8 to 512 rows otherwise within 1%.
- gemm_fetch_sparse: with gemm_fetch_spread, a group whose share is at most
  1/U of its k rows (U a power of two) asks for a line only every U-th k row
  instead of at every one: the line of k row (k * rate) >> 16 moves at most one
  k row in U, so the same lines are asked for once, not up to U times (four
  groups of one height asked for each line four times). v8 on the Intel Xeon
  (48 KiB L1d, 2 MiB L2 per core; k 4096 x n 6144, two threads, the weights from
  memory, alternated in one process): 8 and 16 rows 1.06x, 512-2048 rows
  1.01-1.02x. v16 there: 8 and 16 rows 1.01-1.03x but 128-512 rows 0.97-0.99x,
  so False (its k row is two lines, asked for by two prefetches; why it wants
  the repeats is not known).
- gemm_batch_rows, gemm_batch_kc: a task of at most gemm_batch_rows rows (a
  batch of decode steps, a server's ragged batch) with float32 panels steps k in
  slices of gemm_batch_kc instead of the key's KC (when KC is longer). On the
  Intel Xeon, as above, slices of 128 against 512: v8 4-48 rows 1.03-1.10x (16
  rows 1.09x), 64 rows 1.03x, 96 rows 1.00x, 512-2048 rows 0.96-0.99x; v16 8-32
  rows 1.01-1.06x, 40 rows 0.99x. The block keeps its row stride (KC): a key
  tuned to KC 128 ran as fast at 16 rows. The one-row sweep sums per slice of
  the same length, so a row's projection in a decode step and in a batch of at
  most gemm_batch_rows rows stay the same bits where they were (a fork's decode
  steps against its batched chunk over a bfloat16 cache, whose rounding
  magnifies one float32 ulp, tests/python/test_kv_cache.py) in the columns the
  sweep takes gemm_decode_panels panels at a time. In a task's last panels
  (fewer, swept one at a time with gemm_decode_sums partial sums) the decode
  row, and a taller task's rows anywhere, differ from a batch's by float32
  rounding only. bfloat16, float16 and int8
  panels (half or a quarter of the bytes a k row) ran 0.91-0.98x so at v8, and
  keep the key's KC.
- gemm_decode_panels, gemm_decode_sums: a single row (a decode step) streams
  W, and sweeps this many panels side by side (one core read 34-39 GB/s
  where a panel at a time read 28-30), with this many partial sums (lo/hi
  pairs) in flight in all: one per panel over 4 panels, 4 over a last lone
  panel, enough FMAs in flight to keep up with W's stream.
- gemm_decode_fetch_bytes: how far ahead of its loads, in bytes of a panel, the
  one-row sweep over narrow (bfloat16, float16) or int8 panels asks for each
  line (0: it leaves them to the hardware's prefetchers). Those rows widen
  every vector before its FMA (int8: a widening, a conversion and an FMA per 8
  weights), so a row takes several times the instructions of float32's and
  the loop's own loads keep too few lines in flight. v8 on the Intel Xeon (k
  4096 x n 6144, one row, two threads, the weights from memory, alternated in
  one process), a line asked for once, from where the row is: int8 1.15-1.22x
  (1152-3456 bytes ahead; a burst of the group's lines at its start 1.10-1.13x),
  bfloat16 1.09-1.11x and float16 1.16x (2048 and 4096 bytes ahead); v16 there
  int8 1.15-1.20x, bfloat16 1.10-1.13x, float16 1.12-1.15x (1024-4096 bytes),
  2048 the best or within 2% of it on both. float32 rows are only loads and
  FMAs, and ran 0.99-1.01x with it, so they go without. The decode step at
  context 4096 (the precision stage, alternated builds): v8 int8 1.11x faster,
  bfloat16 1.06x, float16 1.13x; v16 1.17x, 1.06x, 1.15x.
- flash_rows, flash_nj, flash_ne: flash attention's register tiles,
  flash_rows row vectors x NJ keys for Q.K and flash_rows row vectors x NE
  value dims for P.V. At v16 2 x 8: 16 accumulators + 2 loads of 32 zmm (the
  key is a broadcast operand of the FMA). At v8 2 x 8 would not fit 16 ymm,
  and NJ and NE must divide what they step over (a 64-key tile, 16-dim head
  steps), so 4 keys; 3 row vectors x 4 keys is 12 accumulators + 3 q loads
  + 1 broadcast register (AVX2 has no broadcast operand): 7 loads per 12
  FMAs, where 2 x 4 took 6 per 8. One NJ-key score tile: a last partial
  group repeats its last key. A block takes a few more query positions than
  16 when that makes its rows whole tiles (abi.h.j2's
  sneppx_attn_flash_block_rows: 18 for a group of 4 at v8); else its rows past
  the last whole tile go through one tile of fewer row vectors (the one width
  its group needs, e.g. a group of 3 at v16). A block whose keys reach back
  far takes twice the positions where that stays whole tiles
  (sneppx_attn_flash_long_block_rows: 36 for a group of 4 at v8, 32 at v16).
- decode_rows, decode_nj, decode_ne: attn_decode's register tiles when the
  group is narrower than a vector (head dims are the lanes): decode_rows query
  rows x decode_nj keys of Q.K partial sums (plus a key vector each and one q
  vector), decode_rows rows x decode_ne value vectors for P.V (plus decode_ne
  value loads; the probability is a broadcast operand). v16: 4 x 4 = 16
  accumulators + 5 of 32 zmm; v8: 2 x 4 = 8 + 5 of 16 ymm. The rows x keys
  partial sums are one vector's lanes once summed (a shuffle tree, 15 adds for
  16 sums where 16 horizontal sums took ~3x the instructions), so
  decode_rows x decode_nj is the vector width; decode_nj divides the 64-key
  tile; a last partial row or key group repeats its last one.
- decode_packed: the cache types attn_decode reads several elements to a 32-bit
  lane, one load and a shift and a mask per vector (bfloat16: 2, int8: 4;
  PACKED_ELEMENTS), where a widening load per vector (vpmovzxwd, vpmovsxbd) took
  the vector pipes the FMAs need. llvm-mca's Zen 3 model of the v8 loops (d 128,
  group 4): bfloat16 Q.K 41% -> 99% of the FMA bound, P.V 39% -> 81%; int8 53% ->
  99% and 44% -> 73%; Zen 4's model of v8 the same way. v16 keeps int8's
  widening loads: Zen 4's model has its Q.K at 99% of the 512-bit bound that way
  and 86% packed (the shifts and masks run at half rate there), and on Zen 5 both
  measured the same; its bfloat16 gains there (Q.K 88% -> 94%, P.V 79% -> 84%).
  decode_ne is a multiple of each type's elements per lane (a P.V chunk is whole
  loads). v8 no longer reads int8 packed: decode_int8_dot replaced it.
- decode_int8_dot: attn_decode reads an int8 cache by integer dot products
  (queries and a tile's probabilities rounded to int16, products summed in int32
  by pmaddwd, 16 a vpmaddwd where an FMA does 8, no element converted to float;
  docs/ARCHITECTURE.md). Written for 8 lanes: two SSE2 halves per product, which
  the backend joins into one 256-bit vpmaddwd on an AVX2 host and which any
  x86-64 runs, so v8 keeps requiring nothing. On a Zen 3 core packed int8 was
  bound by its arithmetic at 41-44% of the FMA peak from memory and from L2
  alike (0.45x a paged read of its pages); by dot products the kernel ran
  1.23-1.33x faster (llama3-8B's head, d 128, group 4: 256 and 1024 keys from
  L2/L3, 4096 keys from memory; bench/probes/decode_ab.sh, alternated rounds,
  outputs within 3e-6). v16: False (its 16-lane int8 path keeps the widening
  loads; AVX-512's vpmaddwd / VNNI are unmeasured there).
- decode_burst_lines: attn_decode prefetches the next tile's values through P.V,
  a step per key of every pass, unless a pass's share of their lines is at most
  this many: then the pass asks for its share as it starts. v8: 16, the int8
  values of a d 128 group-4 head; on a Zen 3 core the per-key step (its
  arithmetic and branch beside the key's 8 FMAs) took int8 P.V's loop, alone
  in L1, 28% of its time, and with the bursts the int8 kernel ran 1.04-1.05x
  faster from L2 and from memory (bench/probes/decode_ab.sh: alternated rounds
  in one process, one core); float32's 64 lines a pass so ran 0.89x from memory
  (a burst longer than the core's miss queue absorbs,
  bench/probes/prefetch_pace.c), so they keep the steps. v16: 0 (every pass
  steps; unmeasured there).
"""
from dataclasses import dataclass
from typing import FrozenSet, Tuple

from .limits import HEAD_DIM_MULTIPLE


# A GEMM k slice is whole int8 groups (abi.h.j2's SNEPPX_GEMM_INT8_GROUP).
GEMM_KC_MULTIPLE = 32
# The most stack a GEMM kernel's blocks may take (MC x KC activations and a
# KC x NR widened int8 slice): OpenMP's worker threads have 4 MiB by default.
GEMM_MAX_BLOCK_BYTES = 1 << 20
# Elements per 32-bit lane of each cache type attn_decode can read packed (decode_packed).
PACKED_ELEMENTS = {"bfloat16": 2, "int8": 4}
# The most candidates of one tile (runtime/kernel_registry.h's SNEPPX_MAX_TILE_CANDIDATES).
MAX_TILE_CANDIDATES = 8
# Bytes of a cache line on every x86-64 core: the step of the kernels' prefetches.
CACHE_LINE_BYTES = 64


@dataclass(frozen=True)
class Target:
    name: str                        # key suffix: "v16"
    vector_width: int                # floats per vector
    llvm_features: Tuple[str, ...]   # what the host must have, LLVM's names ("+avx512f")
    cpuinfo_flags: Tuple[str, ...]   # the same, as /proc/cpuinfo's flags name them
    gemm_mr: int
    gemm_nr: int
    gemm_small_mr: int
    gemm_kc: int
    gemm_mc: int
    gemm_int8_mc: int
    gemm_kc_candidates: Tuple[int, ...]
    gemm_mc_candidates: Tuple[int, ...]
    gemm_fetch_spread: bool
    gemm_fetch_sparse: bool
    gemm_batch_rows: int
    gemm_batch_kc: int
    gemm_decode_panels: int
    gemm_decode_sums: int
    gemm_decode_fetch_bytes: int
    flash_rows: int
    flash_nj: int
    flash_ne: int
    decode_rows: int
    decode_nj: int
    decode_ne: int
    decode_packed: Tuple[str, ...]
    decode_burst_lines: int
    decode_int8_dot: bool

    @property
    def flash_tile_rows(self) -> int:
        """Query rows (lanes) of one flash register tile."""
        return self.flash_rows * self.vector_width

    @property
    def line_bytes(self) -> int:
        """Bytes of a cache line (CACHE_LINE_BYTES), for the templates' prefetches."""
        return CACHE_LINE_BYTES

    @property
    def line_floats(self) -> int:
        """Floats of a cache line."""
        return CACHE_LINE_BYTES // 4

    @property
    def gemm_row_lines(self) -> Tuple[int, ...]:
        """Offsets (floats) into a row of gemm_nr floats that touch each of its cache
        lines, aligned or not: a line's worth apart, and the row's last float."""
        return tuple(sorted(set(range(0, self.gemm_nr, self.line_floats)) | {self.gemm_nr - 1}))

    def __post_init__(self) -> None:
        """Refuses tiles the templates are not written for, naming the value."""
        def require(ok: bool, why: str) -> None:
            if not ok:
                raise ValueError(f"target {self.name}: {why}")
        vw = self.vector_width
        # vec.c.j2's horizontal sum halves down to 4 lanes; rope, rmsnorm, SDPA
        # and flash step head dims (multiples of HEAD_DIM_MULTIPLE) by whole vectors.
        require(vw >= 8 and vw & (vw - 1) == 0 and HEAD_DIM_MULTIPLE % vw == 0,
                f"vector_width {vw} is not a power of two in [8, {HEAD_DIM_MULTIPLE}]")
        require(all(f.startswith("+") for f in self.llvm_features),
                f"llvm_features {self.llvm_features} are not all +name")
        require(self.gemm_nr == 2 * vw, f"gemm_nr {self.gemm_nr} is not 2 vectors (the microkernel's lo and hi)")
        require(0 < self.gemm_small_mr < self.gemm_mr, f"gemm_small_mr {self.gemm_small_mr} is not in (0, gemm_mr)")
        require(self.gemm_mc % self.gemm_mr == 0, f"gemm_mc {self.gemm_mc} is not whole {self.gemm_mr}-row groups")
        require(self.gemm_int8_mc % self.gemm_mr == 0 and self.gemm_int8_mc >= self.gemm_mc,
                f"gemm_int8_mc {self.gemm_int8_mc} is not whole {self.gemm_mr}-row groups of at least gemm_mc")
        require(self.gemm_kc in self.gemm_kc_candidates and self.gemm_mc in self.gemm_mc_candidates,
                f"gemm_kc {self.gemm_kc} / gemm_mc {self.gemm_mc} are not among their candidates "
                f"{self.gemm_kc_candidates} / {self.gemm_mc_candidates}")
        require(0 < len(self.gemm_kc_candidates) <= MAX_TILE_CANDIDATES
                and 0 < len(self.gemm_mc_candidates) <= MAX_TILE_CANDIDATES,
                f"gemm_kc_candidates / gemm_mc_candidates: 1 to {MAX_TILE_CANDIDATES} values each")
        require(all(kc > 0 and kc % GEMM_KC_MULTIPLE == 0 for kc in self.gemm_kc_candidates),
                f"gemm_kc_candidates {self.gemm_kc_candidates} are not all multiples of {GEMM_KC_MULTIPLE}")
        require(all(mc > 0 and mc % self.gemm_mr == 0 for mc in self.gemm_mc_candidates),
                f"gemm_mc_candidates {self.gemm_mc_candidates} are not all whole {self.gemm_mr}-row groups")
        largest_block = (max(self.gemm_mc_candidates + (self.gemm_int8_mc,)) + self.gemm_nr) * \
            max(self.gemm_kc_candidates) * 4
        require(largest_block <= GEMM_MAX_BLOCK_BYTES,
                f"the largest GEMM block, {largest_block} bytes of stack, is over {GEMM_MAX_BLOCK_BYTES}")
        require(self.gemm_fetch_spread or not self.gemm_fetch_sparse,
                "gemm_fetch_sparse thins the shares of gemm_fetch_spread, which is off")
        require(self.gemm_batch_rows >= 2, f"gemm_batch_rows {self.gemm_batch_rows} is not at least 2")
        require(self.gemm_batch_kc > 0 and self.gemm_batch_kc % GEMM_KC_MULTIPLE == 0,
                f"gemm_batch_kc {self.gemm_batch_kc} is not a positive multiple of {GEMM_KC_MULTIPLE}")
        require(self.gemm_decode_sums % self.gemm_decode_panels == 0,
                f"gemm_decode_sums {self.gemm_decode_sums} is not a multiple of gemm_decode_panels")
        # The sweep asks for a line where a row starts one: a narrow row (two bytes a column
        # of gemm_nr <= 32, by the width's bound above) or an int8 row divides a line, and a
        # distance of whole lines asks for whole lines.
        require(self.gemm_decode_fetch_bytes >= 0 and self.gemm_decode_fetch_bytes % CACHE_LINE_BYTES == 0,
                f"gemm_decode_fetch_bytes {self.gemm_decode_fetch_bytes} is not whole lines of {CACHE_LINE_BYTES} bytes")
        require(self.flash_rows >= 1, f"flash_rows {self.flash_rows} is not at least 1")
        require(HEAD_DIM_MULTIPLE % self.flash_ne == 0,
                f"flash_ne {self.flash_ne} does not divide the head dim step {HEAD_DIM_MULTIPLE}")
        require(64 % self.decode_nj == 0, f"decode_nj {self.decode_nj} does not divide the 64-key tile")
        require(self.decode_ne >= 1, f"decode_ne {self.decode_ne} is not at least 1")
        require(self.decode_burst_lines >= 0, f"decode_burst_lines {self.decode_burst_lines} is below 0")
        require(not self.decode_int8_dot or (vw == 8 and "int8" not in self.decode_packed),
                "decode_int8_dot is written for 8 lanes (two SSE2 pmaddwd halves) and replaces packed int8 reads")
        require(all(name in PACKED_ELEMENTS for name in self.decode_packed),
                f"decode_packed {self.decode_packed}: only {tuple(PACKED_ELEMENTS)} can be read packed")
        for name in self.decode_packed:
            require(self.decode_ne % PACKED_ELEMENTS[name] == 0,
                    f"decode_ne {self.decode_ne} is not whole loads of packed {name} "
                    f"({PACKED_ELEMENTS[name]} vectors a load)")
        # attn_decode sums its decode_rows x decode_nj dot products into one vector's lanes.
        require(self.decode_rows * self.decode_nj == vw,
                f"decode_rows {self.decode_rows} x decode_nj {self.decode_nj} is not the vector width {vw}")


TARGETS: Tuple[Target, ...] = (
    Target("v16", 16, ("+avx512f",), ("avx512f",), gemm_mr=14, gemm_nr=32, gemm_small_mr=4, gemm_kc=512,
           gemm_mc=56, gemm_int8_mc=112, gemm_kc_candidates=(128, 256, 512),
           gemm_mc_candidates=(14, 28, 56), gemm_fetch_spread=True, gemm_fetch_sparse=False,
           gemm_batch_rows=32, gemm_batch_kc=128, gemm_decode_panels=4, gemm_decode_sums=4,
           gemm_decode_fetch_bytes=2048,
           flash_rows=2, flash_nj=8, flash_ne=8, decode_rows=4, decode_nj=4, decode_ne=4,
           decode_packed=("bfloat16",), decode_burst_lines=0, decode_int8_dot=False),
    Target("v8", 8, (), (), gemm_mr=6, gemm_nr=16, gemm_small_mr=4, gemm_kc=512,
           gemm_mc=24, gemm_int8_mc=96, gemm_kc_candidates=(128, 256, 512),
           gemm_mc_candidates=(12, 24, 48), gemm_fetch_spread=True, gemm_fetch_sparse=True,
           gemm_batch_rows=64, gemm_batch_kc=128, gemm_decode_panels=4, gemm_decode_sums=4,
           gemm_decode_fetch_bytes=2048,
           flash_rows=3, flash_nj=4, flash_ne=4, decode_rows=2, decode_nj=4, decode_ne=4,
           decode_packed=("bfloat16",), decode_burst_lines=16, decode_int8_dot=True),
)

# The widths there are, each once, in the order of their first target.
VECTOR_WIDTHS: Tuple[int, ...] = tuple(dict.fromkeys(t.vector_width for t in TARGETS))
TARGET_NAMES: Tuple[str, ...] = tuple(t.name for t in TARGETS)


def _check_table() -> None:
    names = [t.name for t in TARGETS]
    if len(set(names)) != len(names):
        raise ValueError(f"TARGETS: names {names} must be unique (a name is a target's identity)")
    widest = max(t.gemm_nr for t in TARGETS)
    if any(widest % t.gemm_nr for t in TARGETS):
        raise ValueError(f"TARGETS: the widest gemm_nr, {widest}, must be a multiple of every target's "
                         "(GEMM tasks' columns are multiples of it: partition.h.j2's SNEPPX_GEMM_COL_ALIGN)")
    if TARGETS[-1].llvm_features or TARGETS[-1].cpuinfo_flags:
        raise ValueError(f"TARGETS: the last target, {TARGETS[-1].name}, must require nothing (every host runs it)")


_check_table()


def target_of_width(vector_width: int) -> Target:
    """The first target of a vector width, in order of preference (--vector-width, an
    alias from when a width named one target); ValueError naming the widths there are."""
    for t in TARGETS:
        if t.vector_width == vector_width:
            return t
    raise ValueError(f"vector width must be one of {', '.join(map(str, VECTOR_WIDTHS))}, not {vector_width}")


def target_named(name: str) -> Target:
    """The target called name; ValueError naming the targets there are."""
    for t in TARGETS:
        if t.name == name:
            return t
    raise ValueError(f"target must be one of {', '.join(t.name for t in TARGETS)}, not {name!r}")


def cpuinfo_flags(path: str = "/proc/cpuinfo") -> FrozenSet[str]:
    """The first CPU's flags as /proc/cpuinfo lists them; empty where there is no
    such file or no flags line (not Linux, not x86)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_target(cpuinfo_flags) -> Target:
    """The first target whose flags are all among cpuinfo_flags (a set of /proc/cpuinfo names)."""
    return next(t for t in TARGETS if set(t.cpuinfo_flags) <= set(cpuinfo_flags))
