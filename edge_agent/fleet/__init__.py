"""Fleet tools (`edge-agent fleet status|estop|rollout`): MQTT clients like `watch`.

See docs/FLEET.md.
"""
