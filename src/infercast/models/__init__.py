"""infercast.models."""
