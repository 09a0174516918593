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


def older_gen2_release_problem() -> str | None:
    """Why the installed vLLM is not a generation-2 release with facts of its own older than the
    target release (None: it is one)."""
    from conformance.pytest_plugin import vllm_absent
    from reference.errors import NotModeledError
    from reference.releases import TARGET_RELEASE, check_gen2_version, parse_version

    if vllm_absent():
        return "vLLM is not installed"
    version = installed_version()
    try:
        release = check_gen2_version(version)
    except NotModeledError as exc:
        return str(exc)
    if release >= parse_version(TARGET_RELEASE):
        return f"vLLM {version} is the target release, whose facts tests/vllm checks"
    return None
