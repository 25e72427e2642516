"""The conformance kit (infer.core.testing) over every op registered for the CPU platform: the
native kernels' attention, GGUF / int8 linear methods, layer ops, the gloo communicator over two
ranks and the native decode graph, against the core's plain-torch references."""

from __future__ import annotations

from infer.core.testing import conformance_test

test_cpu_conformance = conformance_test("cpu")
