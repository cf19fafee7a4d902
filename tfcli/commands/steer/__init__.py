"""tfcli steer fit and sweep: its core (core.py), renderer (render.py) and command line (cli.py)."""
