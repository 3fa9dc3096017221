/* A rank's refusal of a call the other ranks make (sneppx_layer_shard_refuse):
 * a binding that checks arguments before calling finds them wrong, and takes
 * part in the call's agreement with its verdict instead of leaving the others
 * waiting for it. */
#include "error.h"
#include "layer_internal.h"
#include "shard.h"

sneppx_status sneppx_layer_shard_refuse(sneppx_layer *layer, sneppx_status status, const char *message)
{
    sneppx_clear_error();
    if (!layer)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: must not be NULL");
    if (status <= SNEPPX_OK || status >= SNEPPX_ERR_COMM)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "status: %d is not a refusal (an error status other than SNEPPX_ERR_COMM)", (int)status);
    if (!message)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "message: must not be NULL");
    sneppx_fail(status, "%s", message);
    /* The record is never compared: a refusal ends the agreement first. */
    const struct sneppx_shard_call call = {0};
    return sneppx_shard_agree_call(layer->shard, status, &call);
}
