"""Chapter 3's measurement (`step03_prefix_hash`): its bench and the report drawn from its results."""
