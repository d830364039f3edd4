"""The optional packages optimisation leans on (onnx, onnxruntime, openvino): imported on use, kept quiet."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)


@contextlib.contextmanager
def quiet_vendor_logging() -> Iterator[None]:
    """ONNX Runtime's quantiser calls ``logging.warning`` on the root logger; keep that at debug."""

    def demote(record: logging.LogRecord) -> bool:
        if "onnxruntime" in record.pathname or "onnx" in record.name:
            log.debug("onnxruntime: %s", record.getMessage())
            return False
        return True

    root = logging.getLogger()
    root.addFilter(demote)
    try:
        yield
    finally:
        root.removeFilter(demote)


def first_line(exc: BaseException) -> str:
    """The first line of a vendor exception's message (their messages run to pages), or its type."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def squashed(exc: BaseException, limit: int) -> str:
    """A vendor exception's message on one line, whitespace collapsed, cut at ``limit`` characters."""
    return " ".join(str(exc).split())[:limit]
