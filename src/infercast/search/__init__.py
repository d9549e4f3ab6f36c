"""infercast.search."""
