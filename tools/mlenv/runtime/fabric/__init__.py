"""NCCL and the fabric: NCCL settings, NCCL log lines and verdicts, RDMA preflight, rendezvous, pairs."""
