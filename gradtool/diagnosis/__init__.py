"""Naming the kind of gradient mistake from Jacobian blocks (pure numpy)."""
