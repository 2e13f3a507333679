"""edge-agent: a fault-tolerant runtime daemon for robot controllers."""

__version__ = "0.1.0"
