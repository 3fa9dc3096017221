"""Every path the generator reads, resolved once.

Works from the source tree (gen/sneppx_gen, templates/ beside gen/) and from
the installed layout (share/sneppx/gen/sneppx_gen, share/sneppx/templates):
in both, the templates live next to the generator's directory. The
environment variable SNEPPX_TEMPLATE_DIR overrides the template directory.
"""
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
GEN_DIR = PACKAGE_DIR.parent
ARCHS_JSON = GEN_DIR / "archs.json"
TEMPLATE_DIR = Path(os.environ.get("SNEPPX_TEMPLATE_DIR") or GEN_DIR.parent / "templates")
# The runtime's public headers: include/sneppx in the source tree, PREFIX/include/sneppx
# installed (GEN_DIR is PREFIX/share/sneppx/gen); None when neither is there.
RUNTIME_HEADER_DIR = next((d for d in (GEN_DIR.parent / "include" / "sneppx",
                                       GEN_DIR.parent.parent.parent / "include" / "sneppx") if d.is_dir()), None)
