"""edge_agent.comms layer."""
