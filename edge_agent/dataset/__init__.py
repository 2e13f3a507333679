"""edge_agent.dataset: the decision journal as a LeRobotDataset v3 (offline, never the daemon)."""
