import sys

from mlx_jupyter.cli import main

sys.exit(main())
