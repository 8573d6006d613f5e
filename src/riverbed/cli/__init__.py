"""The ``riverbed`` command: thin, it parses arguments and calls the packages."""

__all__: list[str] = []  # entry point: riverbed.cli.main:main
