"""The core's plain-torch reference ops, offered on every platform.

``torch_native`` attention, the unquantized (dense) linear method, the ``torch`` MoE runner and
the process-group communicator for ``gloo``; the per-layer op references live in
``infer.core.ops.layer_ops``. Device kernels are tested against these (``infer.core.testing``),
and any platform may run them: they are registered for every platform (``platforms`` left
unset) through the same hooks a device plugin uses, by the core's own plugin
(``infer.core.model.registry``). A plugin that registers the same name for its platform wins
there, since plugins load after the core's.

This module is imported by the entry point: it imports nothing heavy (no torch); the
implementations are registered as ``"module:Class"`` strings.
"""

from __future__ import annotations

from typing import Any

from infer.core.hookspecs import hookimpl

ATTENTION = "infer.core.ops.reference.attention:TorchNativeAttention"
DENSE_LINEAR = "infer.core.ops.reference.linear:DenseLinearMethod"
MOE = "infer.core.ops.reference.moe:TorchMoERunner"
PROCESS_GROUP_COMM = "infer.core.ops.comm:ProcessGroupCommunicator"


@hookimpl
def register_attention_backends(register: Any) -> None:
    register("torch_native", ATTENTION)


@hookimpl
def register_linear_methods(register: Any) -> None:
    register(None, DENSE_LINEAR)


@hookimpl
def register_moe_runners(register: Any) -> None:
    register("torch", MOE)


@hookimpl
def register_communicators(register: Any) -> None:
    register("gloo", PROCESS_GROUP_COMM)
