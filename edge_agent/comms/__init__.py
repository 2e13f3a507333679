"""edge_agent.comms: the MQTT bridge onto the command API, the control socket, the cmd client."""
