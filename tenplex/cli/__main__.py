"""`python -m tenplex.cli`: the `tenplex` command without the console script."""

from tenplex.cli.app import main

main()
