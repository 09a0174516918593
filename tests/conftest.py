"""Test-suite settings live in the kvconform pytest plugin (``conformance/pytest_plugin.py``).

The plugin (the ``pytest11`` entry point of this package) registers the hypothesis profiles
``kvconform-ci``/``kvconform-thorough``/``kvconform-gpu`` and loads one explicitly in
``pytest_configure`` (``--kvconform-profile``, default ``ci``), so ``CI=true``, which makes
hypothesis load its own ``ci`` profile at import, changes nothing. It also draws the
seeded case samples (``--kvconform-seed``, ``--kvconform-examples``) and prints them in
the header. Nothing is configured here, so the suite and users' tests run identically.
"""

# pytester's fixtures for tests/plugin/ (``pytest_plugins`` is only allowed in a top-level
# conftest such as this one).
pytest_plugins = ["pytester"]
