"""The OpenAPI document: served, with the real request bodies, and a short schemathesis run.

The long run (at least 1,000 generated requests) is the nox session ``openapi-fuzz``; here a few
cases per operation must give no response >= 500, and the server must answer normally after.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from openapi_fuzz import SERVER_FLAGS, run_schemathesis, still_serves

BODIES = {"/v1/completions": "CompletionRequest", "/v1/chat/completions": "ChatCompletionRequest",
          "/generate": "GenerateRequest", "/tokenize": "TokenizeRequest",
          "/detokenize": "DetokenizeRequest", "/abort_request": "AbortRequest"}


def test_openapi_document_names_the_request_models(http):
    doc = http.get("/openapi.json").json()
    for path, model in BODIES.items():
        body = doc["paths"][path]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
    schemas = doc["components"]["schemas"]
    assert schemas["CompletionRequest"]["properties"]["n"]["maximum"] == 128
    assert "messages" in schemas["ChatCompletionRequest"]["required"]
    assert "/v1/embeddings" not in doc["paths"]  # not implemented: a 501, not part of the contract
    docs = http.get("/docs")
    assert docs.status_code == 200 and "openapi.json" in docs.text


def test_short_schemathesis_run_finds_no_server_error(start_server, tmp_path: Path):
    pytest.importorskip("schemathesis")
    srv = start_server(*SERVER_FLAGS)
    code, sent, tail = run_schemathesis(srv.url, max_examples=10, seed=2, report=tmp_path / "run.ndjson",
                                        phases="fuzzing")
    assert code == 0, tail
    assert sent >= 50, tail
    assert still_serves(srv.url)
