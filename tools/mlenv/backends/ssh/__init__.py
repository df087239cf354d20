"""The ssh backend: a few plain machines reachable over ssh, no scheduler. Node rank = position in ``ssh.hosts``.

``settings`` parses the ``ssh:`` section (``hosts`` the host forms), ``target`` reads a handle back, ``transport``
writes the ssh_config and builds every ssh/rsync argv, ``diagnose`` turns ssh's failures into messages naming the
host, ``probe`` is the stdlib script run on each host (facts, workspace, shared-filesystem marker, jobs), ``facts``
runs it, ``deploy`` checks and prepares the hosts, ``doctor`` has the preflight checks, and ``backend`` maps the
protocol's verbs onto all of it.
"""
