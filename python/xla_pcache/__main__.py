"""``python -m xla_pcache``: the ``xla-pcache`` command."""

from xla_pcache.cli import main

if __name__ == "__main__":
    main()
