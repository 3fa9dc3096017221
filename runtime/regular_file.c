#include "regular_file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int sneppx_open_regular(const char *path, struct stat *st, int *not_regular)
{
    *not_regular = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    if (fstat(fd, st) != 0) {
        const int fstat_errno = errno;
        close(fd);
        errno = fstat_errno;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        *not_regular = 1;
        return -1;
    }
    return fd;
}

/* Linux reads at most about 2 GiB per call. */
#define READ_MAX_BYTES ((size_t)1 << 30)

int sneppx_read_up_to(int fd, uint64_t offset, void *buffer, size_t capacity, size_t *got)
{
    unsigned char *to = buffer;
    *got = 0;
    while (*got < capacity) {
        const size_t want = capacity - *got < READ_MAX_BYTES ? capacity - *got : READ_MAX_BYTES;
        const ssize_t n = pread(fd, to + *got, want, (off_t)(offset + *got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        *got += (size_t)n;
    }
    return 0;
}
