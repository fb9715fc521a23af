"""Publish stage: upload to a private index, build static indexes and pin files, serve an index."""
