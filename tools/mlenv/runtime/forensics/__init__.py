"""What a job leaves for a post-mortem: stack samples and NCCL's flight recorder."""
