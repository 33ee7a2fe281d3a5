"""Scale-out of `run` and `calibrate` on Ray (optional extra `trtforge[ray]`).

shard.py holds the pure parts (work units, the exactly-once ledger, per-worker figures) and is tested
without Ray; pool.py is the Ray actor pool with retries; ray_run.py and ray_calibrate.py are the two
steps' drivers and actors.
"""
