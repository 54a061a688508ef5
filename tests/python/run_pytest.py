"""CTest entry point for the Python tests: exits 77 (CTest's SKIP_RETURN_CODE) when PyTorch or
pytest is missing, so that a machine without them shows the test as skipped rather than passed.

Usage: run_pytest.py [pytest args...]   (FLASHATTN_LIBRARY names the libflashattn.so to load)
"""

import importlib.util
import sys

SKIP = 77

missing = [name for name in ("torch", "pytest") if importlib.util.find_spec(name) is None]
if missing:
    print(f"flashattn python tests skipped: {', '.join(missing)} not installed "
          "(scripts/install-deps.sh installs them)")
    sys.exit(SKIP)

import pytest  # noqa: E402


class Outcomes:
    """Counts outcomes, so that a run where everything skipped (e.g. the model package is
    missing) reports 77 to CTest instead of passing."""

    def __init__(self):
        self.passed = self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.skipped:
            self.skipped += 1


outcomes = Outcomes()
code = pytest.main(sys.argv[1:], plugins=[outcomes])
if code == 0 and outcomes.passed == 0 and outcomes.skipped > 0:
    print("flashattn python tests: every test skipped")
    sys.exit(SKIP)
sys.exit(code)
