"""What test modules share besides fixtures: builders of wheels, ELF files and HIP code, stand-in
servers, small projects. Fixtures live in tests/conftest.py, which imports from here; no test
module imports conftest or another test module (tests/test_layout.py checks it).
"""

import socket
import sys
from pathlib import Path

# The checkout: recipes, docs, docker files and CI templates the tests read.
REPO = Path(__file__).resolve().parents[2]

# rocwheels as a separate process, from this checkout (its working directory or PYTHONPATH must hold it).
ROCWHEELS = (sys.executable, "-m", "pipeline")


def index_build_argv(wheelhouse: Path, recipes: Path) -> list[str]:
    """``rocwheels index build`` of ``wheelhouse``, as a separate process."""
    return [*ROCWHEELS, "--wheelhouse", str(wheelhouse), "--recipes-dir", str(recipes), "index", "build"]


def unused_port(address: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``address`` now: for a server to take, or to find closed."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])
