"""Click-through-rate prediction over 26 Criteo-like id fields and 13 dense counts."""
