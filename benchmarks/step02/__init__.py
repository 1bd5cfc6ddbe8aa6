"""Chapter 2's measurement (`step02_paged`): its bench and the report drawn from its results."""
