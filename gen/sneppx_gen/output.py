"""Writing generated files: atomically, and only when the text changed, so a
rebuild that renders the same text leaves timestamps (and make) alone."""
import os
import tempfile


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_if_changed(path: str, text: str) -> bool:
    """Writes text to path unless it already holds exactly that; returns True if written."""
    data = text.encode()
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except OSError:
        pass
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".sneppx-gen-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; generated files are ordinary files
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True
