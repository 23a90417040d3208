"""Clusters: the master (this machine) turns slaves on and off, bootstraps them over SSH
and trains across them with torchrun (c10d rendezvous, NCCL between GPUs, gloo on CPUs).

settings   the `[cluster]` profile table (torch-free)
sshnode    one slave's SSH connection: exec, streaming exec, SFTP
wheel      this gputui as a wheel, built locally and cached by source hash
bootstrap  Python/torch checks, venv + wheel, dataset copy (md5), marker file
node       runs on every node: torchrun under a supervisor that dies with its SSH channel
worker     one torchrun rank of a cluster run (events on stdout, checkpoint on every node)
launch     the master's side of a cluster run: nodes, relay, recovery
manager    cloud slaves on and off as needed: on-demand start, idle stop, budget
store      small tables of this package in the ledger's SQLite file (idle clock, bench results)
"""
