"""The families of checks the comparator (``conformance.diff``) runs, one module each.

Each module declares the divergence kinds it reports (``KINDS``, a tuple of
``conformance.divergence.Kind``) and the functions that judge them; ``conformance.diff``
lists the families in report order (``FAMILIES``) and calls them. A new family is a new
module here plus its line in ``conformance.diff.FAMILIES``.

- ``layout``: the resolved layout, groups, pool, tensor placement and block sizes;
- ``views``: the views ``register_kv_caches`` gets and what layers are bound to;
- ``block_tables``: request schedules through the runners' block tables and slot mappings;
- ``runners``: MRv1 against MRv2, without the reference;
- ``connectors``: what the connector checks (``conformance.connectors``) report;
- ``engine``: what only a running engine shows (backends, written bytes and tokens, its output).
"""
