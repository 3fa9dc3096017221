/* A rank's refusal of a call the other ranks make (sneppx_layer_shard_refuse):
 * a binding that checks arguments before calling finds them wrong, and takes
 * part in the call's agreement with its verdict instead of leaving the others
 * waiting for it. */
#include "error.h"
#include "layer_internal.h"
#include "shard.h"

/* This rank's verdict: the refusal asked for, or what is wrong with the request. */
static sneppx_status refusal(sneppx_status status, const char *message)
{
    if (status <= SNEPPX_OK || status >= SNEPPX_ERR_COMM)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT,
                           "status: %d is not a refusal (an error status other than SNEPPX_ERR_COMM)", (int)status);
    if (!message)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "message: must not be NULL");
    return sneppx_fail(status, "%s", message);
}

sneppx_status sneppx_layer_shard_refuse(sneppx_layer *layer, sneppx_status status, const char *message)
{
    sneppx_clear_error();
    if (!layer)
        return sneppx_fail(SNEPPX_ERR_INVALID_ARGUMENT, "layer: must not be NULL");
    /* A bad request still refuses: the other ranks are in the call's agreement and
     * would wait for this rank forever. The record is never compared: a refusal
     * ends the agreement first. */
    const struct sneppx_shard_call call = {0};
    const sneppx_status verdict = refusal(status, message);
    if (!layer->shard)
        return verdict;
    pthread_mutex_lock(&layer->shard->calls);
    const sneppx_status refused = sneppx_shard_agree_call(layer->shard, verdict, &call);
    pthread_mutex_unlock(&layer->shard->calls);
    return refused;
}
