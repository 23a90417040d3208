"""Start-up work done side by side, so a run reaches its first step sooner.

From the command to the first step, a run spends most of its time importing torch (1.5 s on
a 2-core VM, 3.4 s on the H100's host), decoding the dataset (0.3-0.4 s) and importing
torch._dynamo (1.0-1.4 s), which torch.optim does on the first optimizer it builds, only to
mark a few functions "never compile" (gputui.train.optim runs them without it wherever this
torch allows). None of these needs another's result:
- the dataset is decoded with numpy alone (gzip, md5 and the IDX parse release the GIL), so
  it runs on a thread while the main thread imports torch;
- torch._dynamo, where it is still needed, is imported on a thread while the main thread
  initialises the device and builds the model, once gputui's own modules are imported (the
  two threads never import the same modules at once).
Errors are the main thread's to report: a dataset that fails to load raises from
`Prefetch.dataset()`; a background import that fails is left for the optimizer to retry.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any


class Prefetch:
    """The dataset of `directory` (None: the bundled MNIST), decoded on a thread from now."""

    def __init__(self, directory: Path | None) -> None:
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._load, args=(directory,), name="gputui-dataset", daemon=True)
        self._thread.start()

    def _load(self, directory: Path | None) -> None:
        from gputui.train.data import load_dataset

        try:
            self._result = load_dataset(directory)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread as is
            self._error = exc

    def dataset(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def warm_dynamo() -> threading.Thread | None:
    """Import torch._dynamo on a thread (torch is imported) where gputui's optimizers need it
    (`gputui.train.optim.DYNAMO_FREE` is False on this torch); the first optimizer then finds it.
    None where they do not: nothing is imported."""
    from gputui.train import optim

    if optim.DYNAMO_FREE:
        return None

    def run() -> None:
        try:
            import torch._dynamo  # noqa: F401
        except Exception:  # noqa: BLE001 - the optimizer imports it again and reports what fails
            pass

    thread = threading.Thread(target=run, name="gputui-dynamo-import", daemon=True)
    thread.start()
    return thread
