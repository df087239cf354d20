"""Backend-agnostic workflows on top of a backend: sync, fan-out exec and logs, launch, demo."""
