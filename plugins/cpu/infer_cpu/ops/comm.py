"""Collectives through torch.distributed (gloo): the core's process-group communicator as is."""

from __future__ import annotations

from infer.core.ops.comm import ProcessGroupCommunicator


class GlooCommunicator(ProcessGroupCommunicator):
    """gloo has no all_gather_into_tensor, so the base's list all-gather is the right one."""
