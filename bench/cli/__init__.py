"""`jenga-bench` (main.py): argument parsing and printing for every subcommand; a study with
flags of its own keeps them beside its code and is mounted by studies.py."""
