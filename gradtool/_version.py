"""The version of gradtool, in one place (a leaf: anything may import it)."""

__version__ = "0.3.0"
