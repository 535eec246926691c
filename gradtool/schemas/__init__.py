"""JSON Schemas of gradtool's machine-readable outputs (package data, read with importlib.resources)."""
