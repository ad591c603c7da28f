"""Test support: fakes, simulators, evaluators and helpers (not tests themselves; never shipped)."""
