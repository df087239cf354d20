"""What every backend that talks to a Kubernetes API shares (OpenShift/Kubernetes, Run:ai): the CLI client and
kubeconfig, the names of the objects (``naming``), pod views and their explanations, waiting, and the preflight
checks."""
