"""Entry point for `python -m runagent`."""

from runagent.cli import main

main()
