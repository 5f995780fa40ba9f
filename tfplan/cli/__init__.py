"""The ``tfplan`` command: one thin module per verb (``cmd_<verb>.py``), each exposing
``add_parsers(subparsers)``; shared helpers in :mod:`.common`, terminal output in :mod:`.output`
and :mod:`.render`."""
