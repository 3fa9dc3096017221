/* perf's map of JIT code: with SNEPPX_PERF_MAP=1 every kernel linked into the
 * JIT adds its functions to /tmp/perf-<pid>.map ("<start> <size> <name>" in
 * hex), so `perf report` names kernel functions instead of [JIT] addresses. */
#ifndef SNEPPX_RUNTIME_PERF_MAP_H
#define SNEPPX_RUNTIME_PERF_MAP_H
#include <stddef.h>
#include <stdint.h>

/* Adds the functions of a kernel's object, linked so that its function
 * entry_symbol starts at entry_address, named "<function> [<key>]". Does
 * nothing unless SNEPPX_PERF_MAP is set to something other than "" or "0";
 * a map that cannot be written, or is not a regular file of this user's with
 * one link (a symlink, FIFO or file planted in /tmp), is reported once
 * (SNEPPX_VERBOSE=1) and skipped. Thread-safe. */
void sneppx_perf_map_add(const char *key, const void *object, size_t object_size, const char *entry_symbol,
                         uint64_t entry_address);

#endif
