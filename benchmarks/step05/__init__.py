"""Chapter 5's measurement (`step05_bridge`): its bench and the report drawn from its results."""
