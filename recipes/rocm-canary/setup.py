"""Builds the ``_canary`` extension with hipcc for the GPU targets rocwheels passes in.

Environment (set by the rocm-canary recipe):
  ROCM_CANARY_OFFLOAD_FLAGS   e.g. "--offload-arch=gfx90a --offload-arch=gfx942" (required)
  ROCM_CANARY_LOCAL_VERSION   e.g. "rocm6.2": becomes the wheel's +local version label
  HIPCC                       the compiler (default: hipcc on PATH)
"""

import os
import shlex
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

BASE_VERSION = "0.1.0"


class HipccBuildExt(build_ext):
    def build_extension(self, ext):
        flags = shlex.split(os.environ.get("ROCM_CANARY_OFFLOAD_FLAGS", ""))
        if not flags:
            raise SystemExit("ROCM_CANARY_OFFLOAD_FLAGS is empty: pass --offload-arch=<gfx...> flags")
        hipcc = os.environ.get("HIPCC", "hipcc")
        output = Path(self.get_ext_fullpath(ext.name))
        output.parent.mkdir(parents=True, exist_ok=True)
        objects = Path(self.build_temp) / "_canary.o"
        objects.parent.mkdir(parents=True, exist_ok=True)
        # Compile and link apart: a compiler cache (ccache) only caches compile-only calls.
        compile_command = [hipcc, "-O2", "-fPIC", "-c", *flags, f"-I{sysconfig.get_paths()['include']}", *ext.sources, "-o", str(objects)]
        link_command = [hipcc, "-shared", *flags, str(objects), "-o", str(output)]
        for command in (compile_command, link_command):
            print("+", shlex.join(command), flush=True)
            subprocess.run(command, check=True)
        targets = [f.split("=", 1)[1] for f in flags if f.startswith("--offload-arch=")]
        (output.parent / "_build_info.py").write_text(
            "# Written at build time by setup.py.\n"
            f"OFFLOAD_TARGETS = {tuple(targets)!r}\n"
        )


local = os.environ.get("ROCM_CANARY_LOCAL_VERSION", "")
setup(
    version=f"{BASE_VERSION}+{local}" if local else BASE_VERSION,
    ext_modules=[Extension("rocm_canary._canary", sources=["src/rocm_canary/_canary.hip"])],
    cmdclass={"build_ext": HipccBuildExt},
)
