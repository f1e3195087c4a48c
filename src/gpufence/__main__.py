"""``python -m gpufence`` = the ``gpufence`` command."""

from gpufence.cli import main

main()
