"""The connector-adapter protocol, where connector authors import it from
(docs/connector-authors.md): a re-export of ``gpu_impl.connectors.base``, its home beside
the built-in adapters that implement it.
"""

from gpu_impl.connectors.base import ConnectorAdapter, ConnectorFactory, ConnectorLike, LayerInfo, Ranges, RegistrationContext, Undrivable  # noqa: E501

__all__ = ["ConnectorAdapter", "ConnectorFactory", "ConnectorLike", "LayerInfo", "Ranges", "RegistrationContext", "Undrivable"]
