"""edge_agent.executor layer."""
