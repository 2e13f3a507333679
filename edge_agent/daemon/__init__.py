"""edge_agent.daemon layer."""
