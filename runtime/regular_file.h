/* Opening a file that comes from outside (a checkpoint) for reading. */
#ifndef SNEPPX_REGULAR_FILE_H
#define SNEPPX_REGULAR_FILE_H

#include <sys/stat.h>

/* Opens path read-only and fstats it. O_NONBLOCK: a FIFO must not make open()
 * wait for a writer. Returns the descriptor of a regular file with *st
 * filled; else -1, with *not_regular 1 when the path opened but is no regular
 * file (nothing left open), 0 when it did not open (errno says why). */
int sneppx_open_regular(const char *path, struct stat *st, int *not_regular);

#endif
