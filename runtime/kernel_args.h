/* Internal: the arguments of one kernel call (struct sneppx_args, the versioned
 * ABI of templates/abi.h.j2) as every caller starts them: zeroed, with the
 * struct's size and the ABI version a kernel checks. */
#ifndef SNEPPX_RUNTIME_KERNEL_ARGS_H
#define SNEPPX_RUNTIME_KERNEL_ARGS_H
#include <string.h>

#include "sneppx_abi.h"

static inline struct sneppx_args sneppx_kernel_args(void)
{
    struct sneppx_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.abi_version = SNEPPX_ABI_VERSION;
    return args;
}

#endif
