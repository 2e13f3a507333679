"""edge_agent.reports layer."""
