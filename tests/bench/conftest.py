"""The benchmark is a script package, not tests: keep pytest out of this directory."""

collect_ignore_glob = ["*"]
