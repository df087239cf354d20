"""Fault injection switches, flipped by tests while the server runs (``server.faults.unschedulable = True``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Faults:
    """What the fake cluster should get wrong. Switches act on pods that are not running yet.

    - ``unschedulable``: the scheduler finds no node with a free GPU; pods stay Pending with
      PodScheduled=False (reason Unschedulable) and a FailedScheduling event.
    - ``image_pull_backoff``: pods are scheduled but their images cannot be pulled; containers wait in
      ImagePullBackOff and Failed/BackOff events name the image.
    - ``forbid_capabilities``: the OpenShift SCC admission rejects pods whose containers add a capability;
      the StatefulSet controller records a FailedCreate event and creates no pods.
    """

    unschedulable: bool = False
    image_pull_backoff: bool = False
    forbid_capabilities: bool = False
