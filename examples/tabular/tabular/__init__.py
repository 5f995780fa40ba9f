"""A small tabular classification project."""
