"""Named and randomized conformance cases (see ``suites.named_cases``)."""
