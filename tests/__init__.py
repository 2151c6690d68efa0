"""trak_dist's tests; shared fixtures are tests.fixtures (pyproject.toml: pythonpath = ["."])."""
