"""A torch extension of one C++ op, built by rocwheels' tests against a real torch wheel."""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="torch-ext",
    # The recipe hands over version and +local label (rocwheels checks the built wheel carries them).
    version=os.environ["TORCH_EXT_VERSION"],
    package_dir={"": "src"},
    packages=["torch_ext"],
    ext_modules=[CppExtension("torch_ext._C", ["src/torch_ext/add_one.cpp"])],
    cmdclass={"build_ext": BuildExtension},
    # What upstream extensions declare; rocwheels' repair pins it to the exact torch it linked.
    install_requires=["torch"],
)
