"""Why a task failed: the catalogue of known failures and the matcher (pure; no I/O)."""
