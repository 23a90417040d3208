"""Cloud slaves: one provider contract (EC2 through boto3, and a simulated twin), pricing,
the cost ledger, the budget guard, the spot interruption watcher and leak protection.

Nothing here imports boto3 at module level; gputui.cloud.ec2 imports it inside.
"""
