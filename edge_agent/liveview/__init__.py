"""The live Foxglove view (`observe.foxglove_port`): a second consumer of the observe tap
(edge_agent/observe/tap.py) that serves the flight recorder's channels over the Foxglove
WebSocket protocol (foxglove-sdk), rate-limited per channel. rate.py is the pure rule;
server.py (foxglove-sdk) is imported only when the port is set, after READY.
docs/OBSERVE.md "Live view".
"""
