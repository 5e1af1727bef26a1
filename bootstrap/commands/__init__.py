"""One module per subcommand; each exposes a function of typed arguments returning an exit code."""
