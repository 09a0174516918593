"""Drivers of vLLM's own KV connectors on CPU, with recording fakes for the transfer
engines, each adapted to the adapter protocol (``base``) so ``kvconform check`` can check
what vLLM's connectors derive at registration and the bytes their planned copies move.

One module per connector; the shared set-up is ``vllm_setup`` (the case's vLLM configs)
and ``cuda_stand_ins`` (the CUDA streams and events of synchronous CPU copies). Only what
hardware or an external service provides is faked.
"""

from gpu_impl.connectors.base import ConnectorAdapter, ConnectorFactory, ConnectorLike, LayerInfo, Ranges, RegistrationContext, Undrivable  # noqa: E501
from gpu_impl.connectors.built_in import BUILT_IN, NOT_DRIVEN

__all__ = ["BUILT_IN", "NOT_DRIVEN", "ConnectorAdapter", "ConnectorFactory", "ConnectorLike", "LayerInfo", "Ranges",
           "RegistrationContext", "Undrivable"]
