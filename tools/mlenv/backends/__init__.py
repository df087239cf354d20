"""Backends: the only code that talks to the outside world (oc/kubectl, ip netns, subprocesses, ...).
Each is found by name in ``mlenv.core.registry.BACKENDS`` and imported only when used."""
