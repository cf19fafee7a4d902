"""`python -m tfcli`."""

from tfcli.cli import main

main()
