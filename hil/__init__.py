"""Hardware-in-the-loop: the simulated robot and the harnesses that drive a real daemon."""
