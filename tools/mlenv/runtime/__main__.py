"""``python3 -m mlenv.runtime``: entry point of the in-pod CLI."""

from .cli import main

raise SystemExit(main())
