"""The fake cluster fixtures for this package's tests (other test packages import them the same way)."""

from .fixtures import fake_kube, fake_kube_factory

__all__ = ["fake_kube", "fake_kube_factory"]
