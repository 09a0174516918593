"""A built-in adapter that cannot drive a release's connector is ``unsupported``, never the
connector's failure or refusal (``conformance.connectors.validate.adapter_gap``): the adapter
reading what the release's worker lacks, or the connector reading what the adapter's
``__new__`` stand-in lacks. A third-party adapter's errors stay the connector's."""

from __future__ import annotations

import pytest

from conformance.connectors.validate import adapter_gap
from gpu_impl.connectors.base import TransferWorkerAdapter, stand_in

BUILT_IN = "gpu_impl.connectors.mooncake:MooncakeAdapter"


class _Worker:
    def __init__(self) -> None:
        self.set_by_init = True

    def register_kv_caches(self) -> bool:
        return self.set_by_init  # a release's connector reading what its __init__ sets


def _raised(call) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def test_the_connector_reading_what_the_stand_in_lacks_is_the_adapters_gap() -> None:
    exc = _raised(stand_in(_Worker).register_kv_caches)
    why = adapter_gap(exc, BUILT_IN)
    assert why is not None and "_Worker stand-in lacks 'set_by_init'" in why
    assert adapter_gap(exc, "my_connector.adapter:Adapter") is None  # not a built-in adapter
    assert adapter_gap(_raised(lambda: _Worker.__new__(_Worker).register_kv_caches()), BUILT_IN) is None


def test_the_adapter_reading_what_the_worker_lacks_is_its_gap() -> None:
    adapter = TransferWorkerAdapter.__new__(TransferWorkerAdapter)
    adapter.worker = object()  # a worker of a release without the attribute the adapter reads
    exc = _raised(lambda: adapter.kernel_block_size)
    assert isinstance(exc, AttributeError)
    why = adapter_gap(exc, BUILT_IN)
    assert why is not None and why.startswith("the adapter could not drive the connector: AttributeError")
    assert "gpu_impl/connectors/base.py" in why


def test_after_registration_only_an_attribute_error_in_the_adapter_is_a_gap() -> None:
    def adapter_arithmetic() -> None:
        raise ValueError("a connector's wrong value surfacing in the adapter")

    adapter_arithmetic.__code__ = adapter_arithmetic.__code__.replace(co_filename="/x/gpu_impl/connectors/nixl.py")
    exc = _raised(adapter_arithmetic)
    assert adapter_gap(exc, BUILT_IN) is None
    assert adapter_gap(exc, BUILT_IN, registering=True) is not None
