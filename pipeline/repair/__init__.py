"""Repair stage: make a raw wheel installable elsewhere without carrying ROCm."""
