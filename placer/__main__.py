"""``python -m placer`` is the ``placer`` command."""

from placer.cli import main

main()
