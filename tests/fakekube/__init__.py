"""fakekube: a small in-process Kubernetes API server for tests driven by the real kubectl/oc binaries.

    with FakeKube(nodes=["gpu-0", "gpu-1"], namespaces=["ml"]) as server:
        ...  # point a kubeconfig at server.url with server.token; see fixtures.fake_cluster
"""

from .access import Deny
from .faults import Faults
from .requestlog import RequestLog, RequestRecord
from .seeds import NodeSpec
from .server import DEFAULT_TOKEN, FakeKube, resource_type

__all__ = ["DEFAULT_TOKEN", "Deny", "FakeKube", "Faults", "NodeSpec", "RequestLog", "RequestRecord", "resource_type"]
