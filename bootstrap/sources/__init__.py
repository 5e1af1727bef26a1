"""Skills from git: sources pinned to a commit and a tree hash, fetched into the user cache."""
