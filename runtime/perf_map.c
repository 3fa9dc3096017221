/* perf's map of JIT code (perf_map.h). The object's function symbols carry
 * offsets within its text section; the linked address of one of its
 * exported functions gives the section's base, and with it every
 * function's address. */
#include "perf_map.h"

#include <errno.h>
#include <fcntl.h>
#include <llvm-c/Core.h>
#include <llvm-c/Object.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

static pthread_once_t enabled_once = PTHREAD_ONCE_INIT;
static int enabled;
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *map; /* opened on the first kernel; NULL after a failure */
static int map_failed;
static pid_t map_pid; /* the process map and map_failed are about */

static void read_enabled(void)
{
    const char *value = getenv("SNEPPX_PERF_MAP");
    enabled = value && value[0] && strcmp(value, "0") != 0;
}

/* Why the opened map must not be written, or NULL. /tmp is shared: another
 * user may have put a FIFO, a hard link or a file of their own at the path
 * (a symlink is refused by O_NOFOLLOW), to make this process, perhaps root,
 * append to a file of their choosing. */
static const char *unsafe_map(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return strerror(errno);
    if (!S_ISREG(st.st_mode))
        return "not a regular file";
    if (st.st_uid != geteuid())
        return "owned by another user";
    if (st.st_nlink != 1)
        return "a hard link of another file";
    return NULL;
}

/* The map file, opened for appending on first use (perf reads it after the
 * process exits). Not created exclusively: another JIT in the process (e.g.
 * CPython's perf trampoline) may append to the same map. */
static FILE *open_map(void)
{
    /* A child forked after the first kernel inherits the parent's map: its
     * kernels lie in its own address space and belong in its own map, which
     * perf reads for its pid (the parent's would name them at addresses that
     * are the parent's). The inherited stream holds nothing unwritten (each
     * add flushes), so closing it writes nothing. */
    if (map_pid != getpid()) {
        if (map)
            fclose(map);
        map = NULL;
        map_failed = 0;
        map_pid = getpid();
    }
    if (map || map_failed)
        return map;
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%ld.map", (long)getpid());
    const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    const char *problem = fd < 0 ? (errno == ELOOP ? "a symbolic link (not followed)" : strerror(errno))
                                 : unsafe_map(fd);
    if (!problem && !(map = fdopen(fd, "a")))
        problem = strerror(errno);
    if (!map) {
        if (fd >= 0)
            close(fd);
        map_failed = 1;
        sneppx_log(1, "SNEPPX_PERF_MAP: not writing %s: %s; kernels stay unnamed in perf", path, problem);
    }
    return map;
}

/* The section and offset of the object's first symbol that starts with
 * prefix and that lookup finds, and its linked address; 0 if found. */
static int find_anchor(LLVMBinaryRef binary, const char *prefix, sneppx_perf_map_lookup lookup, void *context,
                       char *section, size_t section_size, uint64_t *offset, uint64_t *address)
{
    int found = 0;
    const size_t prefix_length = strlen(prefix);
    LLVMSymbolIteratorRef symbol = LLVMObjectFileCopySymbolIterator(binary);
    LLVMSectionIteratorRef containing = LLVMObjectFileCopySectionIterator(binary);
    for (; !found && !LLVMObjectFileIsSymbolIteratorAtEnd(binary, symbol); LLVMMoveToNextSymbol(symbol)) {
        const char *name = LLVMGetSymbolName(symbol);
        if (LLVMGetSymbolSize(symbol) == 0 || strncmp(name, prefix, prefix_length) != 0 ||
            !(*address = lookup(name, context)))
            continue;
        LLVMMoveToContainingSection(containing, symbol);
        if (LLVMObjectFileIsSectionIteratorAtEnd(binary, containing))
            break;
        snprintf(section, section_size, "%s", LLVMGetSectionName(containing));
        *offset = LLVMGetSymbolAddress(symbol);
        found = 1;
    }
    LLVMDisposeSectionIterator(containing);
    LLVMDisposeSymbolIterator(symbol);
    return found ? 0 : -1;
}

void sneppx_perf_map_add(const char *key, const void *object, size_t object_size, const char *symbol_prefix,
                         sneppx_perf_map_lookup lookup, void *context)
{
    pthread_once(&enabled_once, read_enabled);
    if (!enabled)
        return;
    LLVMMemoryBufferRef buffer = LLVMCreateMemoryBufferWithMemoryRange(object, object_size, key, 0);
    char *message = NULL;
    LLVMBinaryRef binary = LLVMCreateBinary(buffer, NULL, &message);
    if (!binary) {
        sneppx_log(1, "SNEPPX_PERF_MAP: kernel '%s': %s", key, message ? message : "unreadable object");
        LLVMDisposeMessage(message);
        LLVMDisposeMemoryBuffer(buffer);
        return;
    }
    char text[64];
    uint64_t anchor_offset = 0, anchor_address = 0;
    if (find_anchor(binary, symbol_prefix, lookup, context, text, sizeof text, &anchor_offset, &anchor_address) == 0) {
        const uint64_t base = anchor_address - anchor_offset;
        pthread_mutex_lock(&map_lock);
        FILE *out = open_map();
        LLVMSymbolIteratorRef symbol = LLVMObjectFileCopySymbolIterator(binary);
        LLVMSectionIteratorRef containing = LLVMObjectFileCopySectionIterator(binary);
        for (; out && !LLVMObjectFileIsSymbolIteratorAtEnd(binary, symbol); LLVMMoveToNextSymbol(symbol)) {
            const uint64_t size = LLVMGetSymbolSize(symbol);
            const char *name = LLVMGetSymbolName(symbol);
            if (size == 0 || !name[0])
                continue;
            /* Functions share the entry's text section; data symbols do not. */
            LLVMMoveToContainingSection(containing, symbol);
            if (LLVMObjectFileIsSectionIteratorAtEnd(binary, containing) ||
                strcmp(LLVMGetSectionName(containing), text) != 0)
                continue;
            fprintf(out, "%llx %llx %s [%s]\n", (unsigned long long)(base + LLVMGetSymbolAddress(symbol)),
                    (unsigned long long)size, name, key);
        }
        if (out)
            fflush(out);
        LLVMDisposeSectionIterator(containing);
        LLVMDisposeSymbolIterator(symbol);
        pthread_mutex_unlock(&map_lock);
    } else {
        sneppx_log(1, "SNEPPX_PERF_MAP: kernel '%s': no linked symbol %s... in one of its objects", key,
                   symbol_prefix);
    }
    LLVMDisposeBinary(binary);
    LLVMDisposeMemoryBuffer(buffer);
}
