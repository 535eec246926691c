"""The command line: click commands, option parsing, exit codes; imports no torch at import time."""
