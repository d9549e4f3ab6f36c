"""infercast.interp."""
