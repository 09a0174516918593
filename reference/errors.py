"""The reference model's exceptions: one root, one class per kind of failure."""

from __future__ import annotations


class ReferenceError_(ValueError):
    """Root of every error the reference model raises on purpose."""


class ConfigError(ReferenceError_):
    """The case is invalid: a value is unknown, malformed or impossible.

    Messages name the offending value and what was expected, e.g.
    ``kernel block size 48 does not divide block size 128; FLASHINFER supports 16, 32, 64``.
    """


class StartupError(ReferenceError_):
    """vLLM itself would refuse this configuration (the reference predicts its error).

    ``vllm_message`` is the text vLLM raises, so a driver can check that vLLM fails
    the same way instead of silently passing.
    """

    def __init__(self, message: str, *, where: str) -> None:
        super().__init__(message)
        self.vllm_message = message
        self.where = where  # the vLLM function that raises it


class NotModeledError(ReferenceError_):
    """The case is valid for vLLM but outside what this reference models (yet)."""
