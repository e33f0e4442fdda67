"""`python -m mlx_jupyter.controller`: ipyparallel's controller, minus a fixed start-up pause.

ipyparallel 9's ``IPController.init_hub`` sleeps 0.25 s after opening its task
database (a wait for a database server; ``--nodb`` has none) before it writes
the connection files that the client and the engines wait for. This controller
skips that sleep and writes the files atomically, so that they can be polled
for often without ever being read half-written. Everything else is ipyparallel's.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from typing import Any

from ipyparallel.controller import app as _app
from ipyparallel.controller.app import IPController


class _NoPause:
    """``time`` as ``init_hub`` sees it: the same, except that ``sleep`` returns at once."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(_seconds: float) -> None:
        return None


class MLXController(IPController):
    """IPController without the pause in ``init_hub``; connection files written atomically."""

    def init_hub(self) -> None:
        real = _app.time
        _app.time = _NoPause()  # type: ignore[assignment]
        try:
            super().init_hub()
        finally:
            _app.time = real

    def save_connection_dict(self, fname: str, cdict: dict) -> None:
        path = os.path.join(self.profile_dir.security_dir, fname)
        self.log.info("writing connection info to %s", path)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")
        try:
            os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(cdict, indent=2))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def main() -> None:
    MLXController.launch_instance()


if __name__ == "__main__":
    main()
