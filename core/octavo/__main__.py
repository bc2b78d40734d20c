"""``python -m octavo`` runs the CLI, like the ``octavo`` script."""

from octavo.entrypoints.cli import main

main()
