"""edge_agent.store layer."""
