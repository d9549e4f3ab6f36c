"""infercast.ops."""
