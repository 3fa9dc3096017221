"""The LLVM pass pipelines the JIT runs on a family's keys (kernels.py's
Kernel.jit_pipeline; each is part of its keys' fingerprints).

O2 is the default: it compiled 15-25% faster than O3 for kernels as fast.
GEMM, FLASH, DECODE and SDPA are default<O2> (as LLVM 19's `opt -print-pipeline-passes`
spells it) without the passes that change nothing in those families'
kernels, which are tiled, vectorized and unrolled by hand: their keys
compile to the IR default<O2> gives them (up to value names, which the JIT
does not keep), with a quarter to a third less `opt` work (docs/PERFORMANCE.md).
scripts/derive_jit_pipeline.py found them (dropping each pass in turn and
keeping the drop when its sample keys' IR stayed the same, at both targets),
and tests/test_jit_pipeline.c checks the sameness on keys of its own: rerun
the script when a template or LLVM changes and that test fails. For decode
attention and SDPA the printed text itself differs from default<O2> (it
spells the function simplification's early-folds-only vector-combine as the
full one, which reorders a 4-float sum): that pass is the first one dropped.
"""
import re

O2 = "default<O2>"


def summary(pipeline: str) -> str:
    """A line for people (sneppx-cache show): the pipeline, or for a pared one
    how many passes it keeps."""
    if pipeline.startswith("default<"):
        return pipeline
    passes = re.findall(r"[\w-]+(?=[,)]|$)", re.sub(r"<[^<>]*>", "", pipeline))  # not the adaptors
    return f"default<O2> pared to {len(passes)} passes"


_INSTCOMBINE = "instcombine<max-iterations=1;no-use-loop-info;no-verify-fixpoint>"
# SimplifyCFG as the simplification passes run it (loops kept) ...
_SIMPLIFYCFG = ("simplifycfg<bonus-inst-threshold=1;no-forward-switch-cond;switch-range-to-icmp;no-switch-to-lookup;"
                "keep-loops;no-hoist-common-insts;no-sink-common-insts;speculate-blocks;simplify-cond-branch;"
                "no-speculate-unpredictables>")
# ... after vectorization (switches to lookups, common code hoisted and sunk) ...
_SIMPLIFYCFG_LATE = ("simplifycfg<bonus-inst-threshold=1;forward-switch-cond;switch-range-to-icmp;switch-to-lookup;"
                     "no-keep-loops;hoist-common-insts;sink-common-insts;speculate-blocks;simplify-cond-branch;"
                     "no-speculate-unpredictables>")
# ... and the last one.
_SIMPLIFYCFG_LAST = ("simplifycfg<bonus-inst-threshold=1;no-forward-switch-cond;switch-range-to-icmp;"
                     "no-switch-to-lookup;keep-loops;no-hoist-common-insts;no-sink-common-insts;speculate-blocks;"
                     "simplify-cond-branch;speculate-unpredictables>")


def _functions(*passes: str) -> str:
    """passes run on every function."""
    return "function<eager-inv>(" + ",".join(passes) + ")"


def _inline_and_simplify(*passes: str) -> str:
    """The inliner over the call graph, bottom up, with passes run on each
    function after its callees are inlined."""
    return "cgscc(devirt<4>(inline,function<eager-inv;no-rerun>(" + ",".join(passes) + "),function-attrs))"


# The cleanup after the module's first constant propagation.
_EARLY_CLEANUP = _functions(_INSTCOMBINE, _SIMPLIFYCFG)

# Loops rotated, with invariants hoisted before and after.
_ROTATE = "loop-mssa(licm<no-allowspeculation>,loop-rotate<header-duplication;no-prepare-for-lto>,licm<allowspeculation>)"

# The middle of GEMM's CGSCC function simplification: cleanups, loops rotated,
# induction variables.
_LOOP_SIMPLIFICATION = ",".join((
    _INSTCOMBINE,
    _SIMPLIFYCFG,
    "reassociate",
    _ROTATE,
    _SIMPLIFYCFG,
    _INSTCOMBINE,
    "loop(loop-idiom,indvars,loop-deletion)",
))

# The end of default<O2>'s per-function optimization, whole, as flash and decode
# attention keep it.
_END_PASSES = (
    _INSTCOMBINE,
    "loop-mssa(licm<allowspeculation>)",
    "alignment-from-assumptions",
    "instsimplify",
    "tailcallelim",
    _SIMPLIFYCFG_LAST,
)
_END = ",".join(_END_PASSES)

# The same without alignment-from-assumptions: GEMM's.
_LATE_CLEANUP = ",".join(p for p in _END_PASSES if p != "alignment-from-assumptions")

FLASH = ",".join((
    "inferattrs",
    _functions("early-cse<>"),
    "ipsccp",
    "globalopt",
    _EARLY_CLEANUP,
    "always-inline",
    _inline_and_simplify(
        "sroa<modify-cfg>",
        "early-cse<memssa>",
        "jump-threading",
        _SIMPLIFYCFG,
        _INSTCOMBINE,
        "reassociate",
        _ROTATE,
        _SIMPLIFYCFG,
        _INSTCOMBINE,
        "loop(loop-idiom,indvars)",
        "gvn<>",
        _INSTCOMBINE,
        "jump-threading",
        "correlated-propagation",
        "loop-mssa(licm<allowspeculation>)",
    ),
    "deadargelim",
    _functions(
        "loop-vectorize<no-interleave-forced-only;no-vectorize-forced-only;>",
        _INSTCOMBINE,
        _SIMPLIFYCFG_LATE,
        "infer-alignment",
        _END,
    ),
))

GEMM = ",".join((
    "inferattrs",
    _functions("sroa<modify-cfg>", "early-cse<>"),
    "ipsccp",
    "globalopt",
    _functions("mem2reg", _INSTCOMBINE, _SIMPLIFYCFG),
    "always-inline",
    _inline_and_simplify(
        "sroa<modify-cfg>",
        "early-cse<memssa>",
        "jump-threading",
        "correlated-propagation",
        _LOOP_SIMPLIFICATION,
        "sroa<modify-cfg>",
        "mldst-motion<no-split-footer-bb>",
        "gvn<>",
        "jump-threading",
        "correlated-propagation",
        _INSTCOMBINE,
    ),
    "deadargelim",
    _functions(
        "loop(loop-deletion)",
        _SIMPLIFYCFG_LATE,
        _INSTCOMBINE,
        "loop-unroll<O2>",
        "sroa<preserve-cfg>",
        _LATE_CLEANUP,
    ),
))

DECODE = ",".join((
    "inferattrs",
    _functions("early-cse<>"),
    "ipsccp",
    _EARLY_CLEANUP,
    "always-inline",
    _inline_and_simplify(
        "sroa<modify-cfg>",
        "early-cse<memssa>",
        _INSTCOMBINE,
        _SIMPLIFYCFG,
        "reassociate",
        "constraint-elimination",
        _ROTATE,
        _SIMPLIFYCFG,
        _INSTCOMBINE,
        "loop(loop-idiom,indvars,loop-deletion,loop-unroll-full)",
        "gvn<>",
        "sccp",
        _INSTCOMBINE,
        "jump-threading",
        "correlated-propagation",
    ),
    "deadargelim",
    "globalopt",
    _functions(
        _INSTCOMBINE,
        _SIMPLIFYCFG_LATE,
        "slp-vectorizer",
        "vector-combine",
        "loop-unroll<O2>",
        _END,
    ),
))

SDPA = ",".join((
    "inferattrs",
    "ipsccp",
    _EARLY_CLEANUP,
    "always-inline",
    _inline_and_simplify(
        "sroa<modify-cfg>",
        "early-cse<memssa>",
        _SIMPLIFYCFG,
        "reassociate",
        "loop-mssa(loop-rotate<header-duplication;no-prepare-for-lto>,licm<allowspeculation>)",
        _SIMPLIFYCFG,
        _INSTCOMBINE,
        "loop(indvars,loop-unroll-full)",
        "gvn<>",
        "correlated-propagation",
        _INSTCOMBINE,
    ),
    "globalopt",
    _functions(
        _SIMPLIFYCFG_LATE,
        "slp-vectorizer",
        "vector-combine",
        "loop-unroll<O2>",
        "infer-alignment",
        _INSTCOMBINE,
        "tailcallelim",
        _SIMPLIFYCFG_LAST,
    ),
))
