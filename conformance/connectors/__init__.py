"""Conformance checks for KV-connector registration code (see docs/connector-authors.md).

Importing this package does not need torch; ``validate_registration`` does.
"""

from conformance.connectors.protocol import ConnectorAdapter, ConnectorFactory, ConnectorLike, LayerInfo, Ranges, RegistrationContext, Undrivable  # noqa: E501
from conformance.connectors.results import CaseResult, ConnectorFinding, ConnectorReport
from conformance.connectors.validate import validate_registration

__all__ = ["CaseResult", "ConnectorAdapter", "ConnectorFactory", "ConnectorFinding", "ConnectorLike", "ConnectorReport",
           "LayerInfo", "Ranges", "RegistrationContext", "Undrivable", "validate_registration"]
