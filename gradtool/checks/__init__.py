"""The checks: one module per property, each returning a CheckResult."""
