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
