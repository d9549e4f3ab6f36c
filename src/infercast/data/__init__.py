"""infercast.data."""
