"""Bundled examples: data that ships with a package, models small enough for a laptop CPU."""
