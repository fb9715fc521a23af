"""rocwheels: build, repair, verify and publish ROCm wheels from pinned recipes.

One module per pipeline stage: ``recipes``/``lock`` (what to build), ``targets`` (GPU
architectures), ``plan`` (ordered steps), ``build``, ``repair``, ``verify``, ``publish``;
``cli`` is a thin click layer over them.
"""


def rocwheels_version() -> str:
    # Imported here: importlib.metadata costs more than a repair that only copies a wheel.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rocwheels")
    except PackageNotFoundError:  # run from a source tree without installing
        return "unknown"
