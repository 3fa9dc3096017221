/* The kernel registry (runtime/kernel_registry.h): lookups in the generated
 * family and bitcode tables, and the canonical key text. */
#include "kernel_registry.h"

#include <stdio.h>
#include <string.h>

#include "error.h"

const struct sneppx_kernel_family *sneppx_kernel_family_find(const char *name)
{
    for (int i = 0; i < sneppx_kernel_family_count; i++)
        if (strcmp(sneppx_kernel_families[i].family, name) == 0)
            return &sneppx_kernel_families[i];
    return NULL;
}

const struct sneppx_target *sneppx_target_named(const char *name)
{
    for (int i = 0; name && i < sneppx_target_count; i++)
        if (strcmp(sneppx_targets[i].name, name) == 0)
            return &sneppx_targets[i];
    return NULL;
}

const struct sneppx_embedded_bitcode *sneppx_kernel_bitcode_find(const char *family,
                                                                 const struct sneppx_target *target)
{
    for (int i = 0; i < sneppx_embedded_bitcode_count; i++) {
        const struct sneppx_embedded_bitcode *bitcode = &sneppx_embedded_bitcodes[i];
        if (bitcode->target == target && strcmp(bitcode->family, family) == 0)
            return bitcode;
    }
    return NULL;
}

sneppx_status sneppx_kernel_check_value(const struct sneppx_kernel_family *family, int field, int64_t value)
{
    const char *name = family->field_names[field];
    const int64_t min = family->field_min[field], max = family->field_max[field];
    const int64_t multiple = family->field_multiple[field];
    if (value < min || value > max)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "values[%d] (%s of %s) = %lld is outside [%lld, %lld]", field,
                           name, family->family, (long long)value, (long long)min, (long long)max);
    if (value % multiple != 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "values[%d] (%s of %s) = %lld is not a multiple of %lld",
                           field, name, family->family, (long long)value, (long long)multiple);
    return SNEPPX_OK;
}

sneppx_status sneppx_kernel_key(const char *family, const int64_t *values, const struct sneppx_target *target,
                                char *key, size_t key_size)
{
    if (!family)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "family is NULL");
    const struct sneppx_kernel_family *kind = sneppx_kernel_family_find(family);
    if (!kind)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "family '%s' is not a kernel family", family);
    if (!values && kind->field_count > 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "values is NULL (family %s has %d key fields)", family,
                           kind->field_count);
    if (!target)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "target is NULL");
    if (!sneppx_kernel_bitcode_find(family, target))
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "target %s: this build has no %s kernels for it",
                           target->name, family);
    if (!key || key_size == 0)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "key is NULL or key_size is 0");

    size_t length = (size_t)snprintf(key, key_size, "%s", family);
    for (int i = 0; i < kind->field_count && length < key_size; i++) {
        const int64_t value = values[i];
        sneppx_status status = sneppx_kernel_check_value(kind, i, value);
        if (status != SNEPPX_OK)
            return status;
        if (kind->field_choices[i])
            length += (size_t)snprintf(key + length, key_size - length, "-%s%s", kind->field_prefixes[i],
                                       kind->field_choices[i][value]);
        else
            length += (size_t)snprintf(key + length, key_size - length, "-%s%lld", kind->field_prefixes[i],
                                       (long long)value);
    }
    if (length < key_size)
        length += (size_t)snprintf(key + length, key_size - length, "-%s", target->name);
    if (length >= key_size)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "key of this %s kernel needs more than key_size %zu bytes",
                           family, key_size);
    return SNEPPX_OK;
}

sneppx_status sneppx_kernel_key_parse(const char *key, char *family, size_t family_size,
                                      const struct sneppx_target **target)
{
    const char *dash = key ? strchr(key, '-') : NULL;
    const struct sneppx_target *named = dash ? sneppx_target_named(strrchr(key, '-') + 1) : NULL;
    if (!named || (size_t)(dash - key) >= family_size)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "key '%s' is not <family>-...-<target>",
                           key ? key : "(null)");
    memcpy(family, key, (size_t)(dash - key));
    family[dash - key] = '\0';
    *target = named;
    return SNEPPX_OK;
}
