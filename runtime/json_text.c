#include "json_text.h"

#include <ctype.h>
#include <string.h>

size_t sneppx_json_bad_text(const char *text, size_t length)
{
    for (size_t i = 0; i < length; i++) {
        if (text[i] == '\0')
            return i;
        if (text[i] != '\\' || i + 1 == length)
            continue;
        if (text[i + 1] == 'u') {
            for (size_t digit = i + 2; digit < i + 6; digit++)
                if (digit >= length || !isxdigit((unsigned char)text[digit]))
                    return i;
            if (memcmp(text + i + 2, "0000", 4) == 0)
                return i;
        }
        i++; /* the escaped character: "\\\\u" is a backslash, then a plain u */
    }
    return length;
}
