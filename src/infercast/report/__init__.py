"""infercast.report."""
