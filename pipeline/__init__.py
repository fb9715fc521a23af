"""rocwheels: build, repair, verify and publish ROCm wheels from pinned recipes.

One module per pipeline stage: ``recipes``/``lock`` (what to build), ``targets`` (GPU
architectures), ``plan`` (ordered steps), ``build``, ``repair``, ``verify``, ``publish``;
``cli`` is a thin click layer over them.
"""
