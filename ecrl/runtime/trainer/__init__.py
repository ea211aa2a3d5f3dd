"""The built-in trainer (`ecrl run`): its data sets and models."""
