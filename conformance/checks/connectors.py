"""Connector checks: the kinds the connector checks (``conformance.connectors``) report.

Their diagnosis runs there, on a connector's own calls; only the kinds are declared here,
so that ``conformance.diff.KINDS`` (reports, expectations) lists them with the rest.
"""

from __future__ import annotations

from conformance.divergence import Kind

KINDS = (
    Kind("connector_copy_plan",
         "a connector accepted what a runner registered and planned copies of other bytes than a "
         "logical block's (field ``CONNECTOR.LAYER``; the generation-1 Mooncake check, "
         "``conformance.connectors.mooncake_gen1``)."),
)

__all__ = ["KINDS"]
