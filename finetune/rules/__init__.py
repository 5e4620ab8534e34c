"""The pure rules: the run's arithmetic, Auto's choices, memory and cost estimates. No data, no torch, no files."""
