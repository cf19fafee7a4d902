"""One package per command: its core, renderer, command line and file formats."""
