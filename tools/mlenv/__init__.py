"""mlenv: one YAML file per GPU cluster -> a working multi-node training environment."""

__version__ = "0.1.0"
