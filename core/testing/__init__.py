"""infer.core.testing: the conformance kit.

It checks every op a platform's plugins register (attention backends, linear methods per
quantization, MoE runners, layer ops, communicators, graph runners), found through the registries
(``infer.core.plugins``), against the core's plain-torch references (``infer.core.ops.reference``,
``infer.core.ops.layer_ops``) on random inputs: float32 and bfloat16, page sizes 1 and 16, cached
prefixes, chunked extends, padding rows, one and two ranks. One command runs it on this machine's
platform (or the one named)::

    python -m infer.core.testing --device cpu        # any pytest options may follow

which is ``INFER_DEVICE=cpu python -m pytest --pyargs infer.core.testing.test_platform``. A plugin's
own tests run it with ``test_conformance = conformance_test("myplatform")`` in a test module.

An op may refuse a configuration it does not take: a ``NotImplementedError`` or ``ValueError``
(``ConfigError``) while it is built, or a ``NotImplementedError`` when it runs; refusals are
listed, and an op that refuses everything fails. A layer op may decline an input by returning
None, and a graph runner a model through ``can_run``; when that leaves nothing to compare, the
case is skipped with the reason. Everything else that differs from the reference fails, with the
configuration and the relative error.
"""

from __future__ import annotations

from infer.core.testing.conformance import KINDS, Case, Target, discover, run_case
from infer.core.testing.outcome import ConformanceFailure, OpRefused, Outcome, Tolerances

__all__ = ["KINDS", "Case", "ConformanceFailure", "OpRefused", "Outcome", "Target", "Tolerances",
           "conformance_test", "discover", "run_case"]


def conformance_test(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 (pytest_suite's signature)
    """``infer.core.testing.pytest_suite.conformance_test`` (imported on use: it needs pytest)."""
    from infer.core.testing.pytest_suite import conformance_test as make

    return make(*args, **kwargs)
