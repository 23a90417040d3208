"""The sweep's Optuna study, on an RDB storage in one SQLite file of the user data directory
(`optuna-dashboard sqlite:///PATH` opens it as is). Only the master process writes to it; readers
(gputui.sweep.reader) open it through `storage()` too, for its busy timeout.

Counting, with resume: a trial that was RUNNING when a master died is marked FAIL with the user
attribute `requeued` = true, and its parameters are enqueued again (the new trial carries
`requeued_from` = the old number). A requeued trial is a record, not a result: a sweep of
`trials` ends with exactly `trials` trials COMPLETE, PRUNED or FAIL *without* `requeued`.
"""

from __future__ import annotations

import sys
import warnings
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from gputui.cloud.redact import holds_secrets, redact_profile, restore_profile
from gputui.model.errors import UserError
from gputui.model.lockfile import Lock, exclusive
from gputui.model.paths import data_home, private_db
from gputui.sweep.space import SweepSpec, parse_text

REQUEUED = "requeued"
REQUEUED_FROM = "requeued_from"
PROFILE_ATTR = "gputui_profile"
PROFILE_PATH_ATTR = "gputui_profile_path"


def sweeps_home() -> Path:
    """Where sweeps keep their study file and their trials' run directories."""
    return data_home() / "sweeps"


def storage_path() -> Path:
    return sweeps_home() / "sweeps.db"


def storage_url(path: Path | None = None) -> str:
    return f"sqlite:///{(path or storage_path()).resolve()}"


def trial_dir(name: str, number: int) -> Path:
    return sweeps_home() / name / f"trial-{number:05d}"


def master_lock(name: str) -> "AbstractContextManager[Lock]":
    """The sweep's master lock (gputui.model.lockfile): one master runs a study at a time. Held from
    before the slots start or a trial is touched until the last slot is closed. It lives apart
    from the sweeps' directory, which a sweep refused for bad input never makes."""
    return exclusive(data_home() / "locks" / f"sweep-{name}.lock")


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its per-trial info lines are ours to print
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def storage(path: Path | None = None) -> Any:
    import sqlite3

    from sqlalchemy import event

    optuna = _optuna()
    target = path or storage_path()
    try:
        private_db(target)  # 0600, as are its -wal/-shm: the study holds the sweep's profile
        # WAL (kept in the file): readers such as `sweep show` or optuna-dashboard never block the
        # master, and a commit costs no fsync of the whole journal: a trial's dozen writes take
        # ~50 ms instead of ~300 ms on a VM's disk. synchronous=NORMAL keeps every commit through a
        # crash of any process (only a power cut may lose the last ones).
        with sqlite3.connect(target, timeout=60) as db:
            db.execute("PRAGMA journal_mode=WAL")
    except (OSError, sqlite3.Error) as exc:
        raise UserError(f"cannot open the sweeps' study file {target}: {exc}") from None
    # A long busy timeout: `sweep show` (or optuna-dashboard) may write while the master does.
    store = optuna.storages.RDBStorage(storage_url(target), engine_kwargs={"connect_args": {"timeout": 60}})

    @event.listens_for(store.engine, "connect")
    def _connected(dbapi: Any, _record: Any) -> None:
        dbapi.execute("PRAGMA synchronous=NORMAL")

    store.engine.dispose()  # connections made before the listener are dropped
    return store


def sampler_and_pruner(spec: SweepSpec) -> tuple[Any, Any]:
    optuna = _optuna()
    if spec.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=spec.sampler_seed)
    else:  # constant liar: trials running side by side are not asked at the same point
        sampler = optuna.samplers.TPESampler(seed=spec.sampler_seed, constant_liar=True)
    if spec.pruner == "median":
        pruner = optuna.pruners.MedianPruner(n_startup_trials=spec.pruner_startup, n_warmup_steps=spec.pruner_warmup)
    else:
        pruner = optuna.pruners.NopPruner()
    return sampler, pruner


def names(store: Any) -> list[str]:
    """The studies in `store`, oldest first."""
    summaries = _optuna().get_all_study_summaries(store, include_best_trial=False)
    return [s.study_name for s in sorted(summaries, key=lambda s: s._study_id)]  # noqa: SLF001 - creation order


def open_study(name: str, store: Any, sampler: Any = None, pruner: Any = None) -> Any:
    """Study `name` in `store` (from `storage()`): the one place a study is loaded."""
    return _optuna().load_study(study_name=name, storage=store, sampler=sampler, pruner=pruner)


def create(spec: SweepSpec) -> Any:
    """A new study for `spec`; a UserError when the name is taken."""
    optuna = _optuna()
    store = storage()
    if spec.name in names(store):
        raise UserError(f"sweep {spec.name} exists already ({storage_path()}): continue it with "
                        f"`gputui sweep --resume {spec.name}`, or set [sweep] name (or --name) to start another")
    sampler, pruner = sampler_and_pruner(spec)
    study = optuna.create_study(study_name=spec.name, storage=store, direction=spec.direction, sampler=sampler,
                                pruner=pruner)
    study.set_user_attr(PROFILE_ATTR, redact_profile(spec.profile_text))  # no webhook, token or password
    study.set_user_attr(PROFILE_PATH_ATTR, spec.profile_path)
    study.set_user_attr("objective", spec.objective_text)  # "max val_acc" for a program: readers split it
    study.set_user_attr("trials", spec.trials)
    return study


def load(name: str, what: str = "--resume") -> tuple[Any, Any, SweepSpec]:
    """An existing study, its profile (gputui.config.profile.Profile) and spec, as recorded at its start."""
    if not storage_path().is_file():
        raise UserError(f"{what} {name}: no sweeps yet ({storage_path()} does not exist); start one with "
                        "`gputui sweep PROFILE`")
    store = storage()
    known_names = names(store)
    if name not in known_names:
        known = ", ".join(known_names[-8:]) or "none"
        raise UserError(f"{what} {name}: no such sweep in {storage_path()} (sweeps: {known})")
    plain = open_study(name, store)
    text = plain.user_attrs.get(PROFILE_ATTR)
    if not isinstance(text, str):
        raise UserError(f"{what} {name}: this study was not made by gputui sweep (no profile recorded)")
    path = plain.user_attrs.get(PROFILE_PATH_ATTR)
    if holds_secrets(text):  # kept by an older gputui: keep it without them from now on
        plain.set_user_attr(PROFILE_ATTR, redact_profile(text))
    text, missing = restore_profile(text, _read_profile(path))
    if missing and what == "--resume":
        print(f"gputui: note: sweep {name}: {', '.join(missing)} not kept in the study (a secret) and "
              f"{path or 'its profile'} no longer holds it: this sweep goes on without it", file=sys.stderr)
    profile, spec = parse_text(text, Path(path) if isinstance(path, str) else None, kept=True)
    if spec.name != name:  # the profile names itself by its file; the study's name is the one to keep
        from dataclasses import replace

        spec = replace(spec, name=name)
    sampler, pruner = sampler_and_pruner(spec)
    study = open_study(name, store, sampler, pruner)
    return study, profile, spec


def _read_profile(path: Any) -> str | None:
    """The text of the profile a study was started from, for the secrets the study does not keep."""
    if not isinstance(path, str):
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def counted(trial: Any) -> bool:
    """Whether a trial counts toward `trials`: finished, and not a requeued record."""
    from optuna.trial import TrialState

    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) and not trial.user_attrs.get(
        REQUEUED)


def requeue_running(study: Any) -> list[int]:
    """Mark the trials a dead master left RUNNING as FAIL (`requeued`) and enqueue their parameters
    again; the numbers of the trials requeued."""
    from optuna.trial import TrialState

    done = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(trial._trial_id, REQUEUED, True)  # noqa: SLF001 - no public setter
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(dict(trial.params), user_attrs={REQUEUED_FROM: trial.number})
        done.append(trial.number)
    return done
