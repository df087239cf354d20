"""The local backend: "pods" on this machine (network namespaces as root, else processes)."""
