"""The maths: problems, finite differences, full and probe Jacobian engines, comparison."""
