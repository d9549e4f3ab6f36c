"""infercast.engine."""
