"""Turning results into output: rich tables, JSON Lines."""
