"""`python -m cli`: the `recommender` command without the installed script."""

from cli.main import main

main()
