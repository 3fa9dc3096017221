# lit configuration: FileCheck tests of generated C (sneppx-gen) and of the
# JIT-specialized IR (sneppx-ir).
import os
import lit.formats

config.name = "sneppx"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.sneppx_binary_dir, "tests", "lit")

llvm_bin = "/usr/lib/llvm-19/bin"
config.environment["PATH"] = os.pathsep.join(
    [os.path.join(config.sneppx_binary_dir, "runtime"), llvm_bin, config.environment.get("PATH", os.environ.get("PATH", ""))])
config.environment["SNEPPX_CACHE_DIR"] = os.path.join(config.sneppx_binary_dir, "test-cache-lit")
config.substitutions.append(("%sneppx-gen", "%s %s" % (config.python, os.path.join(config.sneppx_source_dir, "gen", "sneppx-gen"))))
config.substitutions.append(("%sneppx-ir", os.path.join(config.sneppx_binary_dir, "runtime", "sneppx-ir")))
config.substitutions.append(("%python", config.python))
# The static runtime and the list of what the shared one exports (the rest of the archive's names are internal).
config.substitutions.append(("%sneppx-archive", os.path.join(config.sneppx_binary_dir, "runtime", "libsneppx.a")))
config.substitutions.append(("%sneppx-exports", os.path.join(config.sneppx_source_dir, "runtime", "exports.txt")))
# The runtime's public headers: include/ and the build's rendered sneppx/limits.h.
config.substitutions.append(("%sneppx-includes", "-I%s -I%s" % (os.path.join(config.sneppx_source_dir, "include"),
                                                              os.path.join(config.sneppx_binary_dir, "generated"))))
# %clang-native: clang-19 for this host. clang 19 reads some hosts' CPUID (an
# Intel Xeon with AVX-512 FP16, seen here) as avx10.1-256 and warns about its own
# -march=native, which -Werror would make our failure; the warning is the driver's.
config.substitutions.append(("%clang-native", "clang-19 -march=native -Wno-invalid-feature-combination"))

# REQUIRES: mpi — the build has libsneppx_mpi, so sneppx-run takes --tp.
if config.sneppx_mpi:
    config.available_features.add("mpi")
# %mpi-program: a command that starts MPI, with the MPI tests' ASAN_OPTIONS (Open MPI's
# own allocations are unreachable at exit; tests/mpi/CMakeLists.txt).
config.substitutions.append(("%mpi-program", "env ASAN_OPTIONS=%s" % config.mpi_asan_options))

# REQUIRES: avx512 — the host has AVX-512F.
try:
    with open("/proc/cpuinfo") as cpuinfo:
        flags = cpuinfo.read()
        if " avx512f" in flags:
            config.available_features.add("avx512")
        if " avx512_bf16" in flags:  # REQUIRES: avx512bf16 — vdpbf16ps (gemm_bf16dot at v16)
            config.available_features.add("avx512bf16")
except OSError:
    pass
for cc in ("gcc", "clang-19"):
    if any(os.access(os.path.join(d, cc), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)):
        config.available_features.add(cc)
