"""A stand-in EngineCore whose step never returns in time: only for the engine-loop watchdog test."""

from __future__ import annotations

import time
from types import SimpleNamespace


class HangingCore:
    def __init__(self, args) -> None:
        self.tokenizer = None
        self.loaded = SimpleNamespace(chat_template=None, eos_token_ids=[0], generation_config={},
                                      arch=SimpleNamespace(context_length=64))
        self.work = False

    def make_request(self, rid, ids, params, **kw):
        return rid

    def add_request(self, req) -> None:
        self.work = True

    def has_work(self) -> bool:
        return self.work

    def step(self):
        time.sleep(60)  # a hung forward pass
        return []

    def stats(self) -> dict:
        return {}
