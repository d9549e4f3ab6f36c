"""infercast.cli."""
