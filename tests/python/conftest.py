"""pytest setup for the Python package's tests.

With FLASHATTN_LIBRARY set (the CTest run over a build tree), the package is imported from the
source tree (python/) and loads that library; otherwise the installed package is used
(`pip install --no-build-isolation .`).
"""

import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

if os.environ.get("FLASHATTN_LIBRARY"):
    sys.path.insert(0, str(REPO / "python"))


def pytest_report_header(config):
    try:
        import torch
        import flashattn
    except Exception as e:  # the modules skip themselves; say why once here
        return f"flashattn: not importable ({e})"
    cuda = torch.cuda.is_available() and flashattn.cuda_available()
    return (f"flashattn {flashattn.native_version()} from {flashattn.library_path()}; torch {torch.__version__}; "
            f"CUDA tests {'on' if cuda else 'skipped (no CUDA device or no CUDA backend)'}")
