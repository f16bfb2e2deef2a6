"""The `flashcheck` command (`main`)."""
