"""Exceptions: one class per sneppx_status, each also a standard Python exception.

A failing C call raises the class of its status with the runtime's message
(sneppx_last_error(), which names the offending argument, tensor or file), so
callers can catch either ``sneppx.Error`` or the usual built-in type:

    SNEPPX_ERR_INVALID_ARGUMENT -> InvalidArgumentError (ValueError)
    SNEPPX_ERR_UNKNOWN_PRESET   -> UnknownPresetError   (ValueError)
    SNEPPX_ERR_UNSUPPORTED      -> UnsupportedError     (NotImplementedError)
    SNEPPX_ERR_OUT_OF_MEMORY    -> OutOfMemoryError     (MemoryError)
    SNEPPX_ERR_JIT              -> JITError             (RuntimeError)
    SNEPPX_ERR_IO               -> FileError            (OSError)
    SNEPPX_ERR_FORMAT           -> FormatError          (ValueError)
    SNEPPX_ERR_COMM             -> CommError            (RuntimeError)
"""
from ._library import lib


class Error(Exception):
    """Base of every error the sneppx runtime reports; ``status`` is its sneppx_status name."""
    status = "SNEPPX_ERR"


class InvalidArgumentError(Error, ValueError):
    status = "SNEPPX_ERR_INVALID_ARGUMENT"


class UnknownPresetError(Error, ValueError):
    status = "SNEPPX_ERR_UNKNOWN_PRESET"


class UnsupportedError(Error, NotImplementedError):
    status = "SNEPPX_ERR_UNSUPPORTED"


class OutOfMemoryError(Error, MemoryError):
    status = "SNEPPX_ERR_OUT_OF_MEMORY"


class JITError(Error, RuntimeError):
    status = "SNEPPX_ERR_JIT"


class FileError(Error, OSError):
    status = "SNEPPX_ERR_IO"


class FormatError(Error, ValueError):
    status = "SNEPPX_ERR_FORMAT"


class CommError(Error, RuntimeError):
    """A sharded layer's transport (MPI) failed (LLMConfig.tensor_parallel)."""
    status = "SNEPPX_ERR_COMM"


# Every class's code, found by the C runtime's own names of them (sneppx_status_name), so
# the values live in include/sneppx/status.h alone. Statuses are small: 64 is far past the last.
_CLASSES = (InvalidArgumentError, UnknownPresetError, UnsupportedError, OutOfMemoryError, JITError, FileError,
            FormatError, CommError)
_BY_NAME = {error_class.status: error_class for error_class in _CLASSES}
_BY_STATUS = {code: _BY_NAME[name] for code, name in ((code, lib.sneppx_status_name(code).decode())
                                                       for code in range(1, 64)) if name in _BY_NAME}


def status_code(error_class: type) -> int:
    """The sneppx_status an exception class stands for (_BY_STATUS, read backwards)."""
    return next(code for code, known in _BY_STATUS.items() if known is error_class)


def check(status: int, file: "str | None" = None, generic_prefixes: "tuple[str, ...]" = ()) -> None:
    """Raises the exception of a failed sneppx_status (call right after the C call, same thread).

    file: the message is made to name it: a leading prefix from generic_prefixes
    (how the C call names its input, e.g. "config.json: ") is replaced by "<file>: "."""
    if status == 0:
        return
    message = (lib.sneppx_last_error() or b"").decode("utf-8", "replace")
    if file is not None:
        for prefix in generic_prefixes:
            if message.startswith(prefix):
                message = message[len(prefix):]
                break
        message = f"{file}: {message}"
    error_class = _BY_STATUS.get(status, Error)
    if error_class is Error:
        message = f"{lib.sneppx_status_name(status).decode()}: {message}"
    raise error_class(message)
