"""Chapter 4's measurement (`step04_radix`): its bench and the report drawn from its results."""
