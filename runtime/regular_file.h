/* Opening and reading a file that comes from outside (a checkpoint, a config.json). */
#ifndef SNEPPX_REGULAR_FILE_H
#define SNEPPX_REGULAR_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* Opens path read-only and fstats it. O_NONBLOCK: a FIFO must not make open()
 * wait for a writer. Returns the descriptor of a regular file with *st
 * filled; else -1, with *not_regular 1 when the path opened but is no regular
 * file (nothing left open), 0 when it did not open (errno says why). */
int sneppx_open_regular(const char *path, struct stat *st, int *not_regular);

/* Reads the file's bytes [offset, offset + capacity) into buffer with pread
 * (the descriptor's position is neither used nor moved), until capacity
 * bytes or the end of the file, retrying EINTR; *got says how many. 0 on
 * success (a file that ends early is no error here: the caller names what
 * was cut short), -1 on a read error (errno set). */
int sneppx_read_up_to(int fd, uint64_t offset, void *buffer, size_t capacity, size_t *got);

#endif
