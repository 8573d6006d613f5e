"""The ``riverbed`` command: thin, it parses arguments and calls the packages."""
