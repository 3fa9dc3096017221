/* Internal: how many threads a parallel region of the runtime takes (runtime/team.c). */
#ifndef SNEPPX_RUNTIME_TEAM_H
#define SNEPPX_RUNTIME_TEAM_H

/* wanted threads (0 = OpenMP's default), at least one; one in a child
 * forked after the runtime ran a region on more. */
int sneppx_team_size(int wanted);

#endif
