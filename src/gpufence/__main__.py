"""``python -m gpufence`` = the ``gpufence`` command."""

from gpufence.cli.main import main

main()
