"""`gputui sweep`: many runs at once on every slot; the search is Optuna's, the workers are gputui's.

- space.py      the `[sweep]` profile table and the search space (torch- and optuna-free)
- study.py      the Optuna study on its SQLite file (the master alone talks to it)
- slots.py      where workers run: the Slot / WorkerHandle seam and the local slots
- scheduler.py  hands trials to workers, prunes, retries, counts; the master's loop
- protocol.py   the JSON lines between the master and a worker
- trials.py     the worker's side: trials through gputui's trainer, data loaded once
- programs.py   the worker's side of a sweep of the user's own program: a fresh process per trial
- view.py       the live progress line, plain lines, or JSON lines
- show.py       `gputui sweep show`: the table, the importances, the best run's profile
"""
