"""The conformance kit over the platform ``INFER_DEVICE`` names (else the one infer would select):
``python -m infer.core.testing --device NAME`` runs this module."""

from __future__ import annotations

from infer.core.testing.pytest_suite import conformance_test

test_conformance = conformance_test()
