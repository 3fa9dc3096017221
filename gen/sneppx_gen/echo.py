"""What a message echoes of outside text (a name the user typed, a string of a config
file), as runtime/error.h's sneppx_clip does in the runtime's messages: sneppx-gen's
config reader gives the runtime's messages word for word.

At most a limit of bytes (ECHO_MAX_BYTES, the runtime's SNEPPX_CLIP_BYTES), ending on a
whole UTF-8 character, then "..." when the text was longer, so that a cut name does not
read as the whole; each ASCII control character becomes '?', so that no file or argument
starts a line of its own or sends a terminal escape sequence inside a message.
"""
import re

ECHO_MAX_BYTES = 64

_CONTROL = re.compile(rb"[\x01-\x1f\x7f]")


def clip(text: str, limit: int = ECHO_MAX_BYTES) -> str:
    """text as a message echoes it; a C string ends at its first NUL."""
    limit = min(limit, ECHO_MAX_BYTES)
    whole = text.split("\0", 1)[0].encode("utf-8", "surrogateescape")
    end = min(len(whole), limit)
    if len(whole) > limit and whole[end] & 0xC0 == 0x80:
        # The first byte left out continues a character: drop that character's bytes kept.
        while end > 0 and whole[end - 1] & 0xC0 == 0x80:
            end -= 1
        if end > 0 and whole[end - 1] & 0xC0 == 0xC0:
            end -= 1
    kept = _CONTROL.sub(b"?", whole[:end])
    return kept.decode("utf-8", "replace") + ("..." if len(whole) > limit else "")
