"""`mlx-jupyter` entry point: dispatches to one module per subcommand."""

from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help). Each module has `main(argv: list[str]) -> int`
# and parses its own options, so that a command's arguments are never mistaken
# for the launcher's: options end where the command begins (mlx.launch's parser takes a
# command's own --flags as its own).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("mlx_jupyter.commands.demo", "run a local 2-rank all_sum with our core and with MLX"),
    "doctor": ("mlx_jupyter.commands.doctor", "show which distributed backends can run here, and how to fix the others"),
    "launch": ("mlx_jupyter.launch.command", "run a command on every rank, locally, over ssh or under Slurm"),
    "config": ("mlx_jupyter.configurator.command", "discover Thunderbolt cabling, plan addresses, set up nodes, write a hostfile"),
}


def usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: mlx-jupyter COMMAND [options]   (mlx-jupyter COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "  --version  print the version of mlx-jupyter and of MLX"]
    return "\n".join(lines)


def version() -> str:
    """``mlx-jupyter 0.1.0 (MLX 0.32.4)``: this package's version and the installed MLX's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    from mlx_jupyter import __version__

    try:
        mlx = f"MLX {dist_version('mlx')}"
    except PackageNotFoundError:
        mlx = "MLX not installed"
    return f"mlx-jupyter {__version__} ({mlx})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("--version", "-V", "version"):
        print(version())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        from mlx_jupyter.suggest import did_you_mean

        print(f"mlx-jupyter: unknown command {name!r}{did_you_mean(name, COMMANDS)}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("mlx_jupyter"):
            print(f"mlx-jupyter: the {name!r} command is not available in this build", file=sys.stderr)
            return 2
        raise
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
