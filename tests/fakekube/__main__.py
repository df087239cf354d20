"""``python -m tests.fakekube --port 8080 --node gpu-0 --node gpu-1 --namespace ml [--run-pods]``: serve until Ctrl-C
or SIGTERM."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from dataclasses import fields

from .faults import Faults
from .server import DEFAULT_TOKEN, FakeKube


def main(argv: list[str] | None = None) -> int:
    """Run a FakeKube in the foreground and write a kubeconfig for it."""
    parser = argparse.ArgumentParser(prog="python -m tests.fakekube", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--token", default=DEFAULT_TOKEN, help="the bearer token clients must send")
    parser.add_argument("--node", action="append", dest="nodes", help="a node name (repeat; default node-0..3)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--namespace", action="append", dest="namespaces", help="a namespace to create (repeat)")
    parser.add_argument("--ready-delay", type=float, default=0.0, help="seconds until a scheduled pod is Ready")
    parser.add_argument("--kubeconfig", default="fakekube.kubeconfig", help="where to write the kubeconfig")
    parser.add_argument("--no-openshift", action="store_true", help="plain Kubernetes: no OpenShift API groups")
    parser.add_argument("--run-pods", action="store_true",
                        help="really run scheduled pods on this machine (exec, logs; see README)")
    parser.add_argument("--restart-backoff", type=float, default=10.0,
                        help="seconds before the first restart of a crashed container (doubling, like the kubelet)")
    parser.add_argument("--fault", action="append", default=[], choices=[f.name for f in fields(Faults)],
                        help="switch a fault on (repeat)")
    args = parser.parse_args(argv)
    server = FakeKube(
        token=args.token,
        nodes=args.nodes or [f"node-{i}" for i in range(4)],
        gpus_per_node=args.gpus_per_node,
        namespaces=["default", *(args.namespaces or [])],
        ready_delay=args.ready_delay,
        openshift=not args.no_openshift,
        port=args.port,
        run_pods=args.run_pods,
        restart_backoff=args.restart_backoff,
    )
    for fault in args.fault:
        setattr(server.faults, fault, True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())  # stop() then ends every pod's processes
    with server:
        path = server.write_kubeconfig(args.kubeconfig, (args.namespaces or ["default"])[0])
        print(f"fakekube serving {server.url}; export KUBECONFIG={path.resolve()}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stopped.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
