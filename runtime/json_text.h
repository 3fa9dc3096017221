/* JSON text that comes from outside (a config.json, a safetensors header, a
 * checkpoint's index), checked before cJSON parses it. */
#ifndef SNEPPX_JSON_TEXT_H
#define SNEPPX_JSON_TEXT_H

#include <stddef.h>

/* Where the first byte that would change a string as cJSON reads it starts:
 * a NUL byte, a "\u" not followed by four hex digits, or "\u0000". cJSON
 * ends its C strings at the NUL such an escape decodes to, so it took
 * "num_key_value_heads\u0000x" for "num_key_value_heads" and "llama\u00zz"
 * for "llama" (where JSON refuses the second and HF's reader keeps the first
 * a different key). length when there is none. */
size_t sneppx_json_bad_text(const char *text, size_t length);

/* What sneppx_json_bad_text finds, for the messages that name its offset. */
#define SNEPPX_JSON_BAD_TEXT "a NUL, a \\u escape that is not four hex digits, or \\u0000"

#endif
