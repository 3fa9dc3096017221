"""Writing generated files: atomically, and only when the text changed, so a
rebuild that renders the same text leaves timestamps (and make) alone."""
import os
import stat
import tempfile


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _regular_of_size(path: str, size: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


def write_if_changed(path: str, text: str) -> bool:
    """Writes text to path unless it already holds exactly that; returns True if written.
    Raises OSError whose filename is path."""
    data = text.encode()
    try:
        # Only a regular file of the same size is read: opening a FIFO there would block
        # forever, and a link to /dev/zero would read forever; anything else is replaced.
        if _regular_of_size(path, len(data)):
            with open(path, "rb") as f:
                if f.read(len(data) + 1) == data:
                    return False
    except OSError:
        pass
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".sneppx-gen-")
    except OSError as error:
        raise OSError(error.errno, error.strerror, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; generated files are ordinary files
        os.replace(tmp, path)
    except BaseException as error:
        os.unlink(tmp)
        # The error names the file being written, not the temporary one nobody asked for.
        if isinstance(error, OSError):
            raise OSError(error.errno, error.strerror, path) from None
        raise
    return True
