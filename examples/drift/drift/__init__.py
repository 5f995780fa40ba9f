"""Click prediction over a drifting id stream: one table row per id, hashed ids, or a fixed
vocabulary."""
