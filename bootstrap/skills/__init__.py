"""Python skills in the environment: their pyprojects, batched builds, the build cache, the sync."""
