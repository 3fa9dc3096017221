/* sneppx — the whole public C API. */
#ifndef SNEPPX_SNEPPX_H
#define SNEPPX_SNEPPX_H

#include "sneppx/export.h"
#include "sneppx/status.h"
#include "sneppx/config.h"
#include "sneppx/cache.h"
#include "sneppx/layer.h"
#include "sneppx/kv_cache.h"
#include "sneppx/safetensors.h"
#include "sneppx/shard.h"

#endif
