"""The installed vLLM release and its generation-1 cases, for the tests of this folder."""

from __future__ import annotations

from suites.release_cases import gen1_cases


def installed_version() -> str:
    import vllm

    return vllm.__version__


def release_cases():
    """The installed release's cases (collection needs a list without vLLM too: the
    folder's fixture then skips every test with the reason)."""
    try:
        return gen1_cases(installed_version())
    except Exception:  # noqa: BLE001 - no vLLM: see above
        return gen1_cases("0.21.0")
