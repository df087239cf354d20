"""The one door to the cluster: ``oc`` or ``kubectl``, run as a subprocess.

Every call runs in the deployment's namespace with a time limit; failures become :class:`KubeError`, whose
``reason`` (Unauthorized, Forbidden, NotFound, Unreachable, Timeout, Failed) lets callers explain them.

(openshift-client drove the CLI here before; its runner polls the child with sleeps that double from 10 ms to 1 s,
so a call that took the CLI 0.65 s returned after 1.27 s: most of ``status``'s time over ``kubectl get`` itself.
The command lines it built are kept: ``<cli> VERB --namespace=NS ARGS``.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mlenv.errors import OperationError, UsageError
from mlenv.ui import info

if TYPE_CHECKING:
    from mlenv.backends.kubeapi.objects import ClusterNode, Event, Pod, StatefulSet

CALL_TIMEOUT = 120
"""Seconds one CLI call may take before it is killed."""
PATH_VARIABLE = "OPENSHIFT_CLIENT_PYTHON_DEFAULT_OC_PATH"
INSTALL_HINTS = {
    "oc": "install oc from the OpenShift mirror (https://mirror.openshift.com/pub/openshift-v4/clients/ocp/"
          "stable/) or point OPENSHIFT_CLIENT_PYTHON_DEFAULT_OC_PATH at kubectl",
    "kubectl": "install it with `make install-system` (or see https://kubernetes.io/docs/tasks/tools/)",
}


class KubeError(OperationError):
    """A failed CLI call: ``reason`` classifies it, ``detail`` is the CLI's own message."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def classify(stderr: str) -> str:
    """Unauthorized, Forbidden, NotFound, NotServed (no such resource type), Unreachable or Failed, from a CLI's
    error output."""
    for marker, reason in (("(Unauthorized)", "Unauthorized"), ("must be logged in", "Unauthorized"),
                           ("(Forbidden)", "Forbidden"), ("(NotFound)", "NotFound"),
                           ("doesn't have a resource type", "NotServed"),
                           ("was refused", "Unreachable"), ("no such host", "Unreachable"),
                           ("i/o timeout", "Unreachable"), ("connection refused", "Unreachable")):
        if marker in stderr:
            return reason
    return "Failed"


def _first_error(stderr: str) -> str:
    """The line that says what went wrong (klog noise and warnings skipped)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith(("error", "the connection", "unable"))]
    return (errors or lines or ["the CLI failed without saying why"])[0]


def resolve_binary(cli: str, *, say_stand_in: bool = False) -> str:
    """The CLI to run: $OPENSHIFT_CLIENT_PYTHON_DEFAULT_OC_PATH if set, else ``cli``; for ``oc`` on a machine
    that has only kubectl, kubectl (with a one-line note where ``say_stand_in``: once per deployment, when it is
    deployed, not on every command). UsageError saying how to install it when missing."""
    wanted = os.environ.get(PATH_VARIABLE) or cli
    found = shutil.which(wanted)
    if found is not None:
        return found
    if cli == "oc" and not os.environ.get(PATH_VARIABLE) and (kubectl := shutil.which("kubectl")):
        if say_stand_in:
            info("note: oc is not installed: using kubectl (OpenShift's own commands such as oc login are not "
                 "needed)")
        return kubectl
    flavour = "kubectl" if "kubectl" in os.path.basename(wanted) else cli
    source = f" (from ${PATH_VARIABLE})" if os.environ.get(PATH_VARIABLE) else ""
    raise UsageError(f"{wanted}{source} not found: {INSTALL_HINTS[flavour]}")


class Client:
    """``oc``/``kubectl`` bound to one namespace."""

    def __init__(self, binary: str, namespace: str) -> None:
        self.binary = binary
        self.namespace = namespace

    @property
    def flavour(self) -> str:
        """``kubectl`` or ``oc`` (which verbs and hints apply)."""
        return "kubectl" if "kubectl" in os.path.basename(self.binary) else "oc"

    def run(self, verb: str, args: Sequence[str], *, namespaced: bool = True, timeout: int | None = None,
            stdin: str | None = None) -> str:
        """``<cli> VERB [--namespace=NS] ARGS...`` (in the namespace unless ``namespaced`` is False); its stdout.
        KubeError when it fails or takes longer than ``timeout`` seconds (default CALL_TIMEOUT)."""
        timeout = timeout or CALL_TIMEOUT
        argv = [self.binary, verb, *([f"--namespace={self.namespace}"] if namespaced else []), *args]
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, text=True, errors="replace",
                                  timeout=timeout, check=False, env={**os.environ, "LC_ALL": "en_US.UTF-8"})
        except subprocess.TimeoutExpired:
            raise KubeError("Timeout", f"{os.path.basename(self.binary)} got no answer within {timeout}s") from None
        except OSError as exc:
            raise KubeError("Failed", f"cannot run {self.binary}: {exc.strerror}") from None
        if done.returncode != 0:
            raise KubeError(classify(done.stderr), _first_error(done.stderr))
        return done.stdout

    def select(self, kind: str, labels: Mapping[str, str] | None = None,
               fields: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Every object of ``kind`` matching ``labels`` and the field selector ``fields``, from one list call, as
        parsed (``pods``, ``events`` and ``statefulsets`` have typed views below)."""
        return self._items(kind, labels, fields)

    def pods(self, labels: Mapping[str, str]) -> list[Pod]:
        """The pods matching ``labels``."""
        return self._items("pods", labels, None)

    def warning_events(self) -> list[Event]:
        """The namespace's warning events (every reason ``kubeapi.explain`` reads is a warning)."""
        return self._items("events", None, {"type": "Warning"})

    def statefulsets(self, labels: Mapping[str, str]) -> list[StatefulSet]:
        """The StatefulSets matching ``labels``."""
        return self._items("statefulsets", labels, None)

    def nodes(self) -> list[ClusterNode]:
        """The cluster's nodes."""
        return self._items("nodes", None, None)

    def _items(self, kind: str, labels: Mapping[str, str] | None, fields: Mapping[str, str] | None) -> list[Any]:
        document = json.loads(self.run("get", [kind, "-o=json", *_selectors(labels, fields)]) or "{}")
        return list(document.get("items") or [])

    def apply(self, manifest: str) -> list[str]:
        """Server-side apply a multi-document YAML stream (field manager ``mlenv``, conflicts forced), objects in
        stream order; the ``kind/name`` of each. (Sent as the stream, not as a ``List``: a List makes kubectl
        validate against OpenAPI v2, which servers may no longer publish.)"""
        args = ["-f", "-", "--server-side", "--field-manager=mlenv", "--force-conflicts", "-o", "name"]
        return self.run("apply", args, namespaced=False, stdin=manifest).split()

    def delete(self, kinds: Sequence[str], labels: Mapping[str, str]) -> list[str]:
        """Delete every object of ``kinds`` matching ``labels`` without waiting; ``kind/name`` deleted."""
        args = [",".join(kinds), *_selectors(labels, None), "--ignore-not-found", "-o=name", "--wait=false"]
        return [line for line in self.run("delete", args).split() if "/" in line]  # not "No resources found"


def _selectors(labels: Mapping[str, str] | None, fields: Mapping[str, str] | None) -> list[str]:
    """``--field-selector=k=v,...`` and ``--selector=k=v,...`` for the given selectors."""
    return [f"--{option}={','.join(f'{key}={value}' for key, value in pairs.items())}"
            for option, pairs in (("field-selector", fields), ("selector", labels)) if pairs]
