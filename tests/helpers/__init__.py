"""What test modules share besides fixtures: builders of wheels, ELF files and HIP code, stand-in
servers, small projects. Fixtures live in tests/conftest.py, which imports from here; no test
module imports conftest or another test module (tests/test_layout.py checks it).
"""

from pathlib import Path

# The checkout: recipes, docs, docker files and CI templates the tests read.
REPO = Path(__file__).resolve().parents[2]
