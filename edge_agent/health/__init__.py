"""edge_agent.health layer."""
