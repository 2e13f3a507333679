"""edge_agent.link layer."""
