"""Helpers every stage uses: running commands, signals, logging, progress, the run lock."""
