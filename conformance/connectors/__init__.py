"""Conformance checks for KV-connector registration code (see docs/connector-authors.md).

Importing this package does not need torch; ``validate_registration`` does.
"""

from conformance.connectors.protocol import ConnectorAdapter, LayerInfo, RegistrationContext
from conformance.connectors.validate import ConnectorReport, Divergence, validate_registration

__all__ = ["ConnectorAdapter", "ConnectorReport", "Divergence", "LayerInfo", "RegistrationContext", "validate_registration"]
