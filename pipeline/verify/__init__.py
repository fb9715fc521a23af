"""Verify stage: prove what is inside a repaired wheel, and record what made it."""
