"""Drivers of vLLM 0.33.0's own KV connectors on CPU, with recording fakes for the transfer
engines, adapted to ``conformance.connectors.protocol`` so ``validate_registration`` can
check what vLLM's connectors derive at registration."""
