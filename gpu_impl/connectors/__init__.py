"""Drivers of vLLM's own KV connectors on CPU, with recording fakes for the transfer
engines, adapted to ``conformance.connectors.protocol`` so ``kvconform check`` can check
what vLLM's connectors derive at registration and the bytes their planned copies move.

One module per connector. Each adapter runs the connector's own ``register_kv_caches``
and transfer planning; only what hardware or an external service provides is faked
(copy engines, storage / RDMA services, CUDA streams and events, pinning, the TP rank).
"""


class Undrivable(Exception):
    """The connector's own code cannot be driven for this case on CPU (the message says
    why: a service it needs at registration, a kernel that cannot run here). Reported as
    ``unsupported``, never as the connector's failure or refusal."""


__all__ = ["Undrivable"]
