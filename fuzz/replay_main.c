/* Replays a harness over files, as the ctest fuzz_replay_<harness>: every
 * argument is a file or a directory of files (a directory that does not exist
 * holds none, so regressions/<harness>/ may be absent). Without libFuzzer,
 * with any compiler: the seeds and every input that once crashed run in
 * every build, sanitized or not. */
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Harnesses without an initializer. */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static int replay_file(const char *path)
{
    FILE *stream = fopen(path, "rb");
    if (!stream) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t capacity = 1 << 16, size = 0;
    uint8_t *data = malloc(capacity);
    for (size_t n; data && (n = fread(data + size, 1, capacity - size, stream)) > 0;) {
        size += n;
        if (size == capacity) {
            uint8_t *grown = realloc(data, capacity *= 2);
            if (!grown)
                free(data);
            data = grown;
        }
    }
    fclose(stream);
    if (!data) {
        fprintf(stderr, "%s: out of memory\n", path);
        return -1;
    }
    /* An exact-size copy, as libFuzzer passes it: ASan sees any read past the end. */
    uint8_t *exact = malloc(size ? size : 1);
    if (!exact) {
        free(data);
        return -1;
    }
    memcpy(exact, data, size);
    free(data);
    LLVMFuzzerTestOneInput(exact, size);
    free(exact);
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays every regular file of dir in name order; returns how many, or -1. */
static int replay_directory(const char *dir)
{
    DIR *stream = opendir(dir);
    if (!stream)
        return errno == ENOENT ? 0 : -1;
    char **names = NULL;
    size_t count = 0;
    for (struct dirent *item; (item = readdir(stream)) != NULL;) {
        if (item->d_name[0] == '.')
            continue;
        char **grown = realloc(names, (count + 1) * sizeof *names);
        if (!grown)
            break;
        names = grown;
        names[count] = malloc(strlen(dir) + strlen(item->d_name) + 2);
        if (names[count])
            sprintf(names[count++], "%s/%s", dir, item->d_name);
    }
    closedir(stream);
    qsort(names, count, sizeof *names, compare_names);
    int replayed = 0;
    for (size_t i = 0; i < count; i++) {
        struct stat info;
        if (stat(names[i], &info) == 0 && S_ISREG(info.st_mode)) {
            if (replay_file(names[i]) != 0)
                replayed = -1;
            else if (replayed >= 0)
                replayed++;
        }
        free(names[i]);
    }
    free(names);
    return replayed;
}

int main(int argc, char **argv)
{
    LLVMFuzzerInitialize(&argc, &argv);
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat info;
        int replayed = stat(argv[i], &info) == 0 && S_ISREG(info.st_mode) ? (replay_file(argv[i]) == 0 ? 1 : -1)
                                                                            : replay_directory(argv[i]);
        if (replayed < 0) {
            fprintf(stderr, "cannot replay %s\n", argv[i]);
            return 1;
        }
        printf("%s: %d inputs\n", argv[i], replayed);
        total += replayed;
    }
    printf("%d inputs replayed without a crash or a broken promise\n", total);
    return total > 0 ? 0 : 1;
}
