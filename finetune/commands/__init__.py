"""The command line: the parser (cli.py) and one module per command. Nothing imports it."""
