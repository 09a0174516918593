"""kvconform's harness side: the CLI, reports, the diff engine and the pytest plugin."""
