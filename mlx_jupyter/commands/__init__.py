"""`mlx-jupyter` subcommands that are neither launch nor config."""
