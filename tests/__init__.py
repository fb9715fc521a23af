"""The test suite: a package so its modules import shared code as ``tests.helpers.*`` (see conftest.py)."""
