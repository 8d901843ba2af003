"""What the tests share that is not a test: builders of made-up traces and records, the
small models tests train, fakes of NVML, and ways to start and talk to processes.

Test modules import from here, never from another test module; the fixtures the tests
share live in tests/conftest.py. Scripts that tests run as children are in tests/jobs/.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository's root
