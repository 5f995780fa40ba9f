"""One thin module per CLI verb; each exposes ``add_parser(subparsers)`` and ``run(args) -> int``."""
