"""The primitives: one implementation each of the file, lock, process, tar and log mechanisms every
other family uses; nothing here knows what a venv or a skill is."""
