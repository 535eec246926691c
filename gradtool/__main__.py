"""python -m gradtool."""

from .cli import main

main()
