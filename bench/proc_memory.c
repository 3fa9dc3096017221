/* Resident memory of this process, from /proc/self/status. */
#include <stdio.h>
#include <string.h>

#include "bench.h"

static size_t status_kib(const char *field)
{
    FILE *status = fopen("/proc/self/status", "r");
    if (!status)
        return 0;
    char line[256];
    size_t kib = 0;
    const size_t field_len = strlen(field);
    while (fgets(line, sizeof line, status)) {
        if (strncmp(line, field, field_len) == 0 && line[field_len] == ':') {
            sscanf(line + field_len + 1, "%zu", &kib);
            break;
        }
    }
    fclose(status);
    return kib;
}

size_t bench_vm_hwm_bytes(void) { return status_kib("VmHWM") * 1024; }

size_t bench_vm_rss_bytes(void) { return status_kib("VmRSS") * 1024; }
