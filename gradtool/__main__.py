"""python -m gradtool."""

from .cli.main import main

main()
