"""edge_agent.commands layer."""
