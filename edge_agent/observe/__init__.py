"""Observe: the tap every thread publishes to, the channel registry, the flight recorder.

Only `tap` and `channels` are imported by the daemon's hot paths (stdlib only); the recorder
imports `mcap` lazily, after READY.
"""
