"""/proc readers."""
