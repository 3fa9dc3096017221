/* SNEPPX_PERF_MAP=1: every kernel linked into the JIT (compiled or loaded
 * from the disk cache) names its functions in /tmp/perf-<pid>.map, at the
 * addresses the kernel's entries were linked to. What another user may have
 * planted at that path in /tmp (a symlink, a hard link, a file of theirs) is
 * not written through: the file it leads to stays as it was, with one warning.
 * A child forked after the map was opened writes its kernels to its own map. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels.h"
#include "test_util.h"

/* The size of the map line starting at address whose name begins with name_prefix; 0 if none. */
static unsigned long long mapped_size(const char *path, uintptr_t address, const char *name_prefix)
{
    FILE *map = fopen(path, "r");
    char line[512];
    unsigned long long found = 0;
    while (map && !found && fgets(line, sizeof line, map)) {
        unsigned long long start = 0, size = 0;
        int name_at = 0;
        if (sscanf(line, "%llx %llx %n", &start, &size, &name_at) == 2 && name_at > 0 && start == address &&
            strncmp(line + name_at, name_prefix, strlen(name_prefix)) == 0)
            found = size;
    }
    if (map)
        fclose(map);
    return found;
}

enum plant { PLANT_SYMLINK, PLANT_HARD_LINK, PLANT_FOREIGN_FILE };
static const char *const plant_names[] = {"a symlink", "a hard link", "another user's file"};

static void write_text(const char *path, const char *text)
{
    FILE *file = fopen(path, "w");
    if (file) {
        fputs(text, file);
        fclose(file);
    }
}

/* The whole (small) file as text; "" when unreadable. */
static void read_text(const char *path, char *text, size_t size)
{
    FILE *file = fopen(path, "r");
    size_t got = file ? fread(text, 1, size - 1, file) : 0;
    text[got] = '\0';
    if (file)
        fclose(file);
}

/* Child: plants `plant` at its own map path, leading to victim, then links two
 * kernels with SNEPPX_PERF_MAP=1, warnings going to log. Exits 0 when both resolved. */
static int child_with_planted_map(enum plant plant, const char *victim, const char *log)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%ld.map", (long)getpid());
    unlink(path);
    int planted = plant == PLANT_SYMLINK ? symlink(victim, path) : plant == PLANT_HARD_LINK ? link(victim, path) : 0;
    if (plant == PLANT_FOREIGN_FILE) {
        write_text(path, "");
        planted = chown(path, 65534, 65534); /* nobody */
    }
    int err = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (planted != 0 || err < 0 || dup2(err, 2) < 0)
        return 3;
    setenv("SNEPPX_PERF_MAP", "1", 1);
    setenv("SNEPPX_VERBOSE", "1", 1);
    const int64_t first[] = {64, 32, 0, 0, 512, 56}, second[] = {32, 64, 0, 0, 512, 56};
    const sneppx_kernel *kernel;
    const struct sneppx_target *target = sneppx_host_target();
    return sneppx_kernel_resolve("gemm", first, target, &kernel) == SNEPPX_OK &&
                   sneppx_kernel_resolve("gemm", second, target, &kernel) == SNEPPX_OK
               ? 0
               : 4;
}

static void test_planted_map(test_tally *tally, enum plant plant)
{
    if (plant == PLANT_FOREIGN_FILE && geteuid() != 0) {
        tally->skipped++; /* only root can give a file away */
        return;
    }
    char dir[] = "/tmp/sneppx-perf-map-XXXXXX";
    if (!TEST_CHECK(tally, mkdtemp(dir) != NULL, "mkdtemp"))
        return;
    char victim[96], log[96], text[4096];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(log, sizeof log, "%s/stderr", dir);
    const char *const precious = "precious contents\n";
    write_text(victim, precious);
    fflush(NULL);
    const pid_t child = fork();
    if (child == 0)
        _exit(child_with_planted_map(plant, victim, log));
    int status = -1;
    waitpid(child, &status, 0);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%ld.map", (long)child);
    TEST_CHECK(tally, WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the child exited with %d",
               plant_names[plant], status);
    read_text(victim, text, sizeof text);
    TEST_CHECK(tally, strcmp(text, precious) == 0, "%s at %s: the file it leads to now holds '%.200s'",
               plant_names[plant], path, text);
    if (plant == PLANT_FOREIGN_FILE) {
        read_text(path, text, sizeof text);
        TEST_CHECK(tally, text[0] == '\0', "another user's %s now holds '%.200s'", path, text);
    }
    read_text(log, text, sizeof text);
    int warnings = 0;
    for (const char *at = text; (at = strstr(at, "SNEPPX_PERF_MAP: not writing")); at++)
        warnings++;
    TEST_CHECK(tally, warnings == 1 && strstr(text, path), "%s: want one warning naming %s, got %d: '%s'",
               plant_names[plant], path, warnings, text);
    unlink(path);
    unlink(victim);
    unlink(log);
    rmdir(dir);
}

int main(void)
{
    test_tally tally = {0};
    /* Each in a child of its own, before this process starts any thread: a
     * refused map stays refused for the process. */
    test_planted_map(&tally, PLANT_SYMLINK);
    test_planted_map(&tally, PLANT_HARD_LINK);
    test_planted_map(&tally, PLANT_FOREIGN_FILE);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%ld.map", (long)getpid());
    unlink(path);
    setenv("SNEPPX_PERF_MAP", "1", 1);
    const int64_t gemm_values[] = {64, 96, 0, 0, 512, 56};
    const struct sneppx_target *target = sneppx_host_target();
    const sneppx_kernel *gemm;
    if (!TEST_CHECK(&tally, sneppx_kernel_resolve("gemm", gemm_values, target, &gemm) == SNEPPX_OK,
                    "resolve: %s", sneppx_last_error()))
        return test_finish(&tally);
    char name[256];
    snprintf(name, sizeof name, "sneppx_gemm_k64_n96_bias0_float32_kc512_mc56_%s [%s]", target->name, gemm->key);
    unsigned long long size = mapped_size(path, (uintptr_t)gemm->entry[SNEPPX_ENTRY_RUN], name);
    TEST_CHECK(&tally, size > 64 && size < (1 << 20), "%s: the entry '%s' at %p, size %llu", path, name,
               (void *)(uintptr_t)gemm->entry[SNEPPX_ENTRY_RUN], size);
    snprintf(name, sizeof name, "sneppx_gemm_k64_n96_bias0_float32_kc512_mc56_%s_pack [%s]", target->name, gemm->key);
    size = mapped_size(path, (uintptr_t)gemm->entry[SNEPPX_ENTRY_PACK], name);
    TEST_CHECK(&tally, size > 0, "%s: the pack entry '%s' at %p", path, name,
               (void *)(uintptr_t)gemm->entry[SNEPPX_ENTRY_PACK]);

    /* The same key linked again from the disk cache is named at its new address. */
    sneppx_kernel_cache_reset_for_testing();
    const sneppx_kernel *again;
    if (TEST_CHECK(&tally, sneppx_kernel_resolve("gemm", gemm_values, target, &again) == SNEPPX_OK,
                   "resolve again: %s", sneppx_last_error())) {
        snprintf(name, sizeof name, "sneppx_gemm_k64_n96_bias0_float32_kc512_mc56_%s [%s]", target->name, again->key);
        TEST_CHECK(&tally, mapped_size(path, (uintptr_t)again->entry[SNEPPX_ENTRY_RUN], name) > 0,
                   "%s: '%s' at %p after a reload", path, name, (void *)(uintptr_t)again->entry[SNEPPX_ENTRY_RUN]);
    }

    /* A child forked after the map was opened writes the kernels it links to its own
     * map, not to the parent's (whose addresses are another process's). */
    fflush(NULL);
    const pid_t child = fork();
    if (child == 0) {
        const int64_t child_values[] = {32, 96, 0, 0, 512, 56};
        const sneppx_kernel *kernel;
        _exit(sneppx_kernel_resolve("gemm", child_values, target, &kernel) == SNEPPX_OK ? 0 : 1);
    }
    int status = -1;
    waitpid(child, &status, 0);
    char child_path[64], text[1 << 16], child_name[256];
    snprintf(child_path, sizeof child_path, "/tmp/perf-%ld.map", (long)child);
    snprintf(child_name, sizeof child_name, "sneppx_gemm_k32_n96_bias0_float32_kc512_mc56_%s ", target->name);
    read_text(child_path, text, sizeof text);
    TEST_CHECK(&tally, WIFEXITED(status) && WEXITSTATUS(status) == 0 && strstr(text, child_name),
               "a forked child (status %d) names its kernel '%s' in its own map %s: '%.300s'", status, child_name,
               child_path, text);
    read_text(path, text, sizeof text);
    TEST_CHECK(&tally, !strstr(text, child_name), "the parent's map %s does not name the child's kernel '%s'", path,
               child_name);
    unlink(child_path);
    unlink(path);
    return test_finish(&tally);
}
