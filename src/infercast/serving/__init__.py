"""infercast.serving."""
