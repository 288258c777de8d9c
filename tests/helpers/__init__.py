"""Helpers shared by the test tiers: they call the production code (harness) rather than re-implement it."""
