"""Skill trees on disk (SKILL.md, entries, hashes) and the two ways out: publish into a skill root,
push into a sandbox. Nothing here knows the environment side (config, venv, marker)."""
