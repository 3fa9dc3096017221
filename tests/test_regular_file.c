/* sneppx_read_up_to, the one read loop of the safetensors reader (header and
 * tensors at offsets), config.json and the checkpoint index (from offset 0):
 * it reads at the offset it is given whatever the descriptor's position, stops
 * short at the end of the file without an error, and reports a failed read
 * with errno. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "regular_file.h"
#include "test_util.h"

#define FILE_BYTES 100

static unsigned char byte_at(size_t i) { return (unsigned char)(i * 7 + 3); }

/* got bytes read from offset are the file's bytes there. */
static int bytes_match(const unsigned char *buffer, uint64_t offset, size_t got)
{
    for (size_t i = 0; i < got; i++)
        if (buffer[i] != byte_at((size_t)offset + i))
            return 0;
    return 1;
}

static void test_reads(test_tally *tally, int fd)
{
    unsigned char buffer[2 * FILE_BYTES];
    size_t got = 12345;
    int rc = sneppx_read_up_to(fd, 0, buffer, FILE_BYTES, &got);
    TEST_CHECK(tally, rc == 0 && got == FILE_BYTES && bytes_match(buffer, 0, got), "whole file: rc %d, got %zu", rc,
               got);

    rc = sneppx_read_up_to(fd, 37, buffer, 10, &got);
    TEST_CHECK(tally, rc == 0 && got == 10 && bytes_match(buffer, 37, got), "10 bytes at 37: rc %d, got %zu", rc, got);

    /* The descriptor's position is not where it reads (nor is it moved). */
    TEST_CHECK(tally, lseek(fd, 50, SEEK_SET) == 50, "lseek: %s", strerror(errno));
    rc = sneppx_read_up_to(fd, 0, buffer, 8, &got);
    TEST_CHECK(tally, rc == 0 && got == 8 && bytes_match(buffer, 0, got),
               "8 bytes at 0 with the position at 50: rc %d, got %zu, first byte %u (want %u)", rc, got, buffer[0],
               byte_at(0));
    TEST_CHECK(tally, lseek(fd, 0, SEEK_CUR) == 50, "position after the read: %lld, want 50",
               (long long)lseek(fd, 0, SEEK_CUR));

    /* The end of the file: a short count, not an error. */
    rc = sneppx_read_up_to(fd, 90, buffer, 64, &got);
    TEST_CHECK(tally, rc == 0 && got == 10 && bytes_match(buffer, 90, got), "64 bytes at 90 of 100: rc %d, got %zu",
               rc, got);
    rc = sneppx_read_up_to(fd, 2 * FILE_BYTES, buffer, 4, &got);
    TEST_CHECK(tally, rc == 0 && got == 0, "past the end: rc %d, got %zu", rc, got);
    rc = sneppx_read_up_to(fd, 5, buffer, 0, &got);
    TEST_CHECK(tally, rc == 0 && got == 0, "no bytes: rc %d, got %zu", rc, got);
}

static void test_read_errors(test_tally *tally, const char *dir)
{
    unsigned char buffer[4];
    size_t got = 12345;
    errno = 0;
    int rc = sneppx_read_up_to(-1, 0, buffer, sizeof buffer, &got);
    TEST_CHECK(tally, rc == -1 && errno == EBADF && got == 0, "fd -1: rc %d, errno %s, got %zu", rc, strerror(errno),
               got);
    int dir_fd = open(dir, O_RDONLY | O_DIRECTORY);
    TEST_CHECK(tally, dir_fd >= 0, "open %s: %s", dir, strerror(errno));
    if (dir_fd < 0)
        return;
    errno = 0;
    rc = sneppx_read_up_to(dir_fd, 0, buffer, sizeof buffer, &got);
    TEST_CHECK(tally, rc == -1 && errno == EISDIR, "a directory: rc %d, errno %s", rc, strerror(errno));
    close(dir_fd);
}

int main(void)
{
    test_tally tally = {0};
    const char *tmp = getenv("TMPDIR");
    char dir[256], path[320];
    snprintf(dir, sizeof dir, "%s/sneppx-regular-file-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    snprintf(path, sizeof path, "%s/bytes", dir);
    FILE *stream = fopen(path, "wb");
    for (size_t i = 0; stream && i < FILE_BYTES; i++)
        fputc(byte_at(i), stream);
    if (!stream || fclose(stream) != 0) {
        perror(path);
        return 2;
    }
    struct stat st;
    int not_regular;
    int fd = sneppx_open_regular(path, &st, &not_regular);
    TEST_CHECK(&tally, fd >= 0 && st.st_size == FILE_BYTES, "sneppx_open_regular %s: %s", path, strerror(errno));
    if (fd >= 0) {
        test_reads(&tally, fd);
        close(fd);
    }
    test_read_errors(&tally, dir);
    unlink(path);
    rmdir(dir);
    return test_finish(&tally);
}
