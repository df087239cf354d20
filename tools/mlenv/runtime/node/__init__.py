"""Facts of this node: host, GPUs, topology, PCI, RDMA, routes, the node list, /proc and /sys reads."""
