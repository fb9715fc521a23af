"""What test modules share besides fixtures: builders of wheels, ELF files and HIP code, stand-in
servers, small projects. Fixtures live in tests/conftest.py, which imports from here; no test
module imports conftest or another test module (tests/test_layout.py checks it).
"""

import sys
from pathlib import Path

# The checkout: recipes, docs, docker files and CI templates the tests read.
REPO = Path(__file__).resolve().parents[2]

# rocwheels as a separate process, from this checkout (its working directory or PYTHONPATH must hold it).
ROCWHEELS = (sys.executable, "-m", "pipeline")
