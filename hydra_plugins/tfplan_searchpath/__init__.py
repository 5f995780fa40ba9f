"""tfplan's config tree under the user's own config groups (see tfplan.config.compose.conf_dir)."""
