"""The conformance kit over the platform ``INFER_DEVICE`` names (else the one infer would select):
``python -m infer.core.testing --device NAME`` runs this module. ``INFER_CONFORMANCE_PAGE_SIZES``
(comma-separated, default 1,16) sets the KV page sizes attention is checked with."""

from __future__ import annotations

import os

from infer.core.testing.pytest_suite import conformance_test

PAGE_SIZES = tuple(int(p) for p in os.environ.get("INFER_CONFORMANCE_PAGE_SIZES", "1,16").split(","))

test_conformance = conformance_test(page_sizes=PAGE_SIZES)
