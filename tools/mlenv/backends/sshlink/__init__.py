"""What every backend that reaches machines over ssh shares (the ssh backend, and Slurm's login host): the host
forms (``hosts``), the ssh_config and every ssh/rsync argv (``transport``), and the cluster-file fields that name
ssh files and hops (``fields``)."""
