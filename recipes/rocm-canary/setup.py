"""Builds the ``_canary`` extension with hipcc for the GPU targets rocwheels passes in.

Environment (set by the rocm-canary recipe):
  ROCM_CANARY_OFFLOAD_FLAGS   e.g. "--offload-arch=gfx90a --offload-arch=gfx942" (required)
  ROCM_CANARY_LOCAL_VERSION   e.g. "rocm6.2": becomes the wheel's +local version label
  ROCM_CANARY_HIPCC_FLAGS     optional extra hipcc flags for compile and link, e.g.
                              "--offload-compress" (set by a lock line whose clang writes
                              compressed offload bundles)
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
        targets = shlex.split(os.environ.get("ROCM_CANARY_OFFLOAD_FLAGS", ""))
        if not targets:
            raise SystemExit("ROCM_CANARY_OFFLOAD_FLAGS is empty: pass --offload-arch=<gfx...> flags")
        # On the command line rather than in hipcc's own *_APPEND variables: a compiler cache
        # keys on the command line, so a compressed and a plain build never share an entry.
        flags = [*targets, *shlex.split(os.environ.get("ROCM_CANARY_HIPCC_FLAGS", ""))]
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
        processors = [f.split("=", 1)[1] for f in targets if f.startswith("--offload-arch=")]
        (output.parent / "_build_info.py").write_text(
            "# Written at build time by setup.py.\n"
            f"OFFLOAD_TARGETS = {tuple(processors)!r}\n"
        )


local = os.environ.get("ROCM_CANARY_LOCAL_VERSION", "")
setup(
    version=f"{BASE_VERSION}+{local}" if local else BASE_VERSION,
    ext_modules=[Extension("rocm_canary._canary", sources=["src/rocm_canary/_canary.hip"])],
    cmdclass={"build_ext": HipccBuildExt},
)
