"""What one conformance check found: the configurations that matched the reference, those the op
refused with a clear error, and the mismatches."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


class ConformanceFailure(AssertionError):
    """An op disagreed with the core's reference (or raised); the message lists every case."""


class OpRefused(Exception):
    """The op refused a configuration with a clear error (raised while it was being built, or a
    ``NotImplementedError`` at run time): reported, not a failure, unless it refuses everything."""


@dataclass(frozen=True)
class Tolerances:
    """Bounds on ``rel_err`` (||out - ref|| / ||ref||) against the core's references."""

    float32: float = 1e-4
    bfloat16: float = 2e-2
    # a quantized linear method against the product with the dense weight it was built from
    quantized: float = 0.08
    # an fp8 e4m3 KV cache written from rotated k (fused rotary): round-to-nearest on both sides
    # puts them half a step (2^-4) apart at most; e5m2, one mantissa bit fewer, gets twice this.
    # Triton's CPU interpreter truncates instead (measured 0.098 on e4m3): pass 0.14 there
    fp8_rounding: float = 0.07

    def for_dtype(self, dtype: Any) -> float:
        return self.float32 if str(dtype) == "torch.float32" else self.bfloat16


REFUSALS_WHEN_BUILDING = (NotImplementedError, ValueError)


def build(factory: Callable[..., Any], *args: Any) -> Any:
    """``factory(*args)``; a NotImplementedError / ValueError (ConfigError) becomes ``OpRefused``."""
    try:
        return factory(*args)
    except REFUSALS_WHEN_BUILDING as e:
        raise OpRefused(f"{type(e).__name__}: {e}") from e


@dataclass
class Outcome:
    what: str  # "attention backend 'triton'"
    matched: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @contextmanager
    def case(self, label: str) -> Iterator[None]:
        """Run one configuration: a ConformanceFailure or any other exception is recorded as a
        failure, OpRefused (or NotImplementedError) as a refusal, anything else as a match."""
        try:
            yield
        except OpRefused as e:
            self.refused.append(f"{label}: {e}")
        except NotImplementedError as e:
            self.refused.append(f"{label}: NotImplementedError: {e}")
        except ConformanceFailure as e:
            self.failures.append(f"{label}: {e}")
        except Exception as e:  # an op that raises on valid input is a failure, with where
            tb = traceback.extract_tb(e.__traceback__)[-1]
            self.failures.append(f"{label}: raised {type(e).__name__}: {e} "
                                 f"({tb.filename}:{tb.lineno})")
        else:
            self.matched.append(label)

    def expect_close(self, label: str, err: float, tol: float) -> None:
        if not err <= tol:
            raise ConformanceFailure(f"{label}: relative error {err:.3g} > {tol:g}")

    def raise_if_failed(self, every_refusal_fails: bool = True) -> Outcome:
        """Raise ConformanceFailure listing the mismatches, or, with ``every_refusal_fails``,
        when every configuration was refused (an op that runs nothing conforms to nothing);
        else return self."""
        if self.failures:
            raise ConformanceFailure(
                f"{self.what}: {len(self.failures)} of "
                f"{len(self.failures) + len(self.matched)} configurations disagree with the "
                f"reference:\n  " + "\n  ".join(self.failures))
        if not self.matched and every_refusal_fails:
            raise ConformanceFailure(f"{self.what} refused every configuration the kit tried:\n  "
                                     + "\n  ".join(self.refused))
        return self

    def summary(self) -> str:
        text = f"{self.what}: {len(self.matched)} configurations match the reference"
        if self.refused:
            text += f", {len(self.refused)} refused:\n  " + "\n  ".join(self.refused)
        return text
