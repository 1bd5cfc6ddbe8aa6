"""Chapter 1's measurement (`step01_kvcache`): its bench and the report drawn from its results."""
