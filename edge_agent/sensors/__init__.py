"""edge_agent.sensors layer."""
