/* perf's map of JIT code: with SNEPPX_PERF_MAP=1 every kernel linked into the
 * JIT adds its functions to /tmp/perf-<pid>.map ("<start> <size> <name>" in
 * hex), so `perf report` names kernel functions instead of [JIT] addresses. */
#ifndef SNEPPX_RUNTIME_PERF_MAP_H
#define SNEPPX_RUNTIME_PERF_MAP_H
#include <stddef.h>
#include <stdint.h>

/* Where the JIT linked a symbol, 0 if it did not. */
typedef uint64_t (*sneppx_perf_map_lookup)(const char *symbol, void *context);

/* Adds the functions of one of a kernel's objects, named
 * "<function> [<key>]". Their addresses come from the first function whose
 * name starts with symbol_prefix (the key's own, exported symbols) and that
 * lookup finds: its linked address less its offset is the base of its
 * section. Does nothing unless SNEPPX_PERF_MAP is set to something other
 * than "" or "0"; a map that cannot be written, or is not a regular file of
 * this user's with one link (a symlink, FIFO or file planted in /tmp), is
 * reported once (SNEPPX_VERBOSE=1) and skipped. Thread-safe. */
void sneppx_perf_map_add(const char *key, const void *object, size_t object_size, const char *symbol_prefix,
                         sneppx_perf_map_lookup lookup, void *context);

#endif
