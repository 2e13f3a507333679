"""The simulated robot firmware: physics, firmware behaviour and faults on a real tty."""
