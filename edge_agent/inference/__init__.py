"""edge_agent.inference layer."""
