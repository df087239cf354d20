"""The shared core under ops and backends: the capabilities a backend may implement (typed Protocols), Handle and
the other records they exchange, the backend registry, and the helpers several backends share (fan-out jobs,
the in-node remote wrapper)."""
