"""Command-line interface: thin typer commands over the Python API."""
