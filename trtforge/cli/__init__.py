"""The command line: the typer app (app.py), one module per command, shared option checks and rendering."""
