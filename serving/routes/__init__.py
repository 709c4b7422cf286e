"""One router per consumer of the service."""
