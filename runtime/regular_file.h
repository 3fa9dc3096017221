/* Opening and reading a file that comes from outside (a checkpoint, a config.json). */
#ifndef SNEPPX_REGULAR_FILE_H
#define SNEPPX_REGULAR_FILE_H

#include <stddef.h>
#include <sys/stat.h>

/* Opens path read-only and fstats it. O_NONBLOCK: a FIFO must not make open()
 * wait for a writer. Returns the descriptor of a regular file with *st
 * filled; else -1, with *not_regular 1 when the path opened but is no regular
 * file (nothing left open), 0 when it did not open (errno says why). */
int sneppx_open_regular(const char *path, struct stat *st, int *not_regular);

/* Reads from fd into buffer until capacity bytes or end of file, retrying
 * EINTR; *got says how many. 0 on success, -1 on a read error (errno set). */
int sneppx_read_up_to(int fd, char *buffer, size_t capacity, size_t *got);

#endif
