"""Orchestration: targets and specs -> jobs -> checks -> Report, and the hunt for the wrong Function in a model."""
