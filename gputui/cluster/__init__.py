"""Clusters: the master (this machine) turns slaves on and off, bootstraps them over SSH
and trains across them with torchrun (gputui's static rendezvous: gputui.train.launch; NCCL between GPUs, gloo on CPUs).

settings   the `[cluster]` profile table (torch-free)
sshnode    one slave's SSH connection: exec, streaming exec, SFTP
wheel      this gputui as a wheel, built locally and cached by source hash
bootstrap  Python/torch checks, venv + wheel, dataset copy (md5), marker file
node       runs on every node: torchrun under a supervisor that dies with its SSH channel
worker     one torchrun rank of a cluster run (events on stdout, checkpoint on every node)
launch     the master's side of a cluster run: bring-up, attempts, teardown, in order
context    the record every part of a run works on (nodes, slaves started, phase)
identity   the run's nonce: slave run directories, rendezvous ids, relayed events
bringup    connect, start cloud slaves, wait for SSH, bootstrap, serve the rendezvous
attempts   torchrun per node under one rendezvous, monitored; relaunches
relay      rank 0's events into the master's run; checkpoint fetches
recovery   lost nodes replaced or dropped between attempts
members    the nodes, and the one way they are stopped and killed
procs      one node's torchrun as seen from the master (local process or SSH channel)
teardown   nodes stopped, slaves released, connections closed, whatever happened
stopping   signals that only count while a run lives, and the `stopping` reports
output     the master's events: events.jsonl, the view, stderr
manager    cloud slaves on and off as needed: on-demand start, idle stop, budget
store      small tables of this package in the ledger's SQLite file (idle clock, bench results)
"""
