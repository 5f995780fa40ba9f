"""Wide-and-deep click prediction over a large id vocabulary."""
